"""ladder's parity adapter for the JAX + Flax + Optax port: see ladder/parity/side.py for the convention.

The reference's weights go into flax's parameter tree by name (model.from_torch_names: Dense kernels
are the Linear weights transposed, LayerNorm scales are their weights), and gradients and parameters
come back in the reference's names and layouts (model.to_torch_names). Forward outputs, the loss and the
shard-averaged gradient come from this port's own code (train.make_loss_and_grads), and so do the
optimizer steps: train.main runs on the one fixed batch with dropout off and is stopped after `steps`.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import model as model_module
import train
from data import N_CLASSES, N_FEATURES

HIDDEN = 128


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _fixed_batches(batch: Mapping[str, np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One batch per step (batch["x"][i] for step i), then stop."""
    yield from zip(batch["x"], batch["y"])
    raise _Enough


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    mlp = train.MLP(N_FEATURES, HIDDEN, N_CLASSES, dropout=0.0)
    like = mlp.init(jax.random.PRNGKey(seed), jnp.zeros((1, N_FEATURES)), train=False)["params"]
    params, transplant = model_module.from_torch_names(weights, like)
    x, y = jnp.asarray(batch["x"][0]), jnp.asarray(batch["y"][0].astype(np.int32))
    outputs = np.asarray(mlp.apply({"params": params}, x, train=False))
    shards = train.parse_args([]).shards
    loss, grads = jax.jit(train.make_loss_and_grads(mlp, shards))(params, x, y, jax.random.PRNGKey(seed))

    class Transplanted(model_module.MLP):
        def init(self, *args: Any, **kwargs: Any) -> dict:  # type: ignore[override]
            return {"params": params}

    make_train_step = train.make_train_step
    final: list[Any] = []

    def recording(*args: Any, **kwargs: Any) -> Any:
        step = make_train_step(*args, **kwargs)

        def wrapped(*a: Any) -> Any:
            out = step(*a)
            final[:] = [out[0]]
            return out

        return wrapped

    train.MLP = lambda *a, **k: Transplanted(*a, **{**k, "dropout": 0.0})
    train.make_train_step = recording
    train.train_batches = lambda *a, **k: _fixed_batches(batch)
    try:
        train.main(["--seed", str(seed)])
    except _Enough:
        pass
    return {"outputs": outputs, "loss": float(loss), "grads": model_module.to_torch_names(grads),
            "params": model_module.to_torch_names(final[0] if final else params), "transplant": transplant}
