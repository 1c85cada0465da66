"""Parity adapter for charlm's jax_pure_fn port (the GPT as plain JAX functions, no Flax), JAX side.

The port keeps its parameters in one flat dict keyed by the PyTorch state-dict names, in torch's layouts
(a Linear weight is (out, in), applied as x @ W.T + b), so the transplant is the identity. It runs the
port's own train.main with the reference's arguments (--seed 0 --steps 300, so the hand-set schedule is the
reference's). The adapter only swaps: train.init_params returns the reference's weights, train.get_batch
hands out the fixed batches in order, and the optimizer handed to make_train_step is wrapped to record the
gradient it receives (the port's own loss's, before its clipping, as the reference's p.grad is); the run
stops after `steps` updates. Model, loss, clipping, AdamW with its decay mask and the schedule are the
port's own. The forward outputs are the port's train.forward applied to the first batch. charlm has no
dropout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import model as port_model
import train

ARGV = ["--seed", "0", "--steps", "300", "--eval-every", "100"]  # the reference adapter's


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _recording_tx(tx: optax.GradientTransformation, seen: dict[str, Any]) -> optax.GradientTransformation:
    """tx, with the first gradient it is handed copied to the host (once; a replica's call)."""
    def keep(grads: Any) -> None:
        seen.setdefault("grads", jax.tree.map(np.asarray, grads))

    def update(grads: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        jax.debug.callback(keep, grads)
        return tx.update(grads, state, params, **extra)

    return optax.GradientTransformation(tx.init, update)


def _recording(make_train_step: Any, seen: dict[str, Any]) -> Any:
    def make(*args: Any, **kwargs: Any) -> Any:
        args = tuple(_recording_tx(a, seen) if isinstance(a, optax.GradientTransformation) else a for a in args)
        step = make_train_step(*args, **kwargs)

        def wrapped(*a: Any, **k: Any) -> Any:
            out = step(*a, **k)
            seen.setdefault("loss", out[-1])
            seen["params"] = out[0]
            return out

        return wrapped

    return make


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    names = list(weights)
    params = {k: jnp.asarray(np.array(weights[k])) for k in names}
    _, _, vocab = train.make_dataset()
    cfg = train.GPTConfig(vocab_size=len(vocab), block_size=train.BLOCK_SIZE)
    assert set(port_model.param_shapes(cfg)) == set(names), (sorted(names), sorted(port_model.param_shapes(cfg)))
    outputs = np.asarray(train.forward(params, jnp.asarray(batch["x"][0].astype(np.int32)), cfg))

    pairs = iter(zip(batch["x"], batch["y"]))

    def fixed(*a: Any, **k: Any) -> tuple[np.ndarray, np.ndarray]:
        try:
            x, y = next(pairs)
        except StopIteration:
            raise _Enough from None  # every fixed batch has been trained on
        return x.astype(np.int32), y.astype(np.int32)

    seen: dict[str, Any] = {}
    train.init_params = lambda *a, **k: dict(params)
    train.get_batch = fixed
    train.make_train_step = _recording(train.make_train_step, seen)
    try:
        train.main(ARGV)
    except _Enough:
        pass
    jax.effects_barrier()
    loss = np.asarray(seen["loss"]).reshape(-1)[0]
    return {"outputs": outputs, "loss": float(loss),
            "grads": {k: np.asarray(seen["grads"][k]) for k in names},
            "params": {k: np.asarray(seen["params"][k]) for k in names},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}
