"""Parity adapter for regress's JAX ports whose pipeline ships RAW features and standardises them in the
train step (benign_jax_standardize_in_step, fault_jax_standardize_default_axis; ladder/parity/side.py has
the convention).

The regress JAX adapter (variants/benign_jax_normal_init/parity_adapter.py) with one change: the fixed
batches are the reference's standardised features, so they are handed to the port in its own input form,
mapped back to raw features with the training split's statistics, x * std + mean (float64, then float32;
the statistics of the port's own make_dataset's raw training features). The port's step then applies its
own standardisation to them. It runs the port's own train.main. The adapter only swaps: train.MLP's init returns the reference's
weights (Dense kernel = Linear weight transposed), train.make_dataset returns the fixed batches as the
training set and train.epoch_batches cuts them in order, and the optimizer handed to make_train_step is
wrapped to record the gradient it receives (what the port's own loss and all-reduce produced). The run
stops after `steps` updates. Loss, gradient, optimizer and schedule are the port's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import train

LAYERS = {"net.0": "Dense_0", "net.2": "Dense_1", "net.4": "Dense_2"}  # torch name -> flax module


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _to_flax(weights: Mapping[str, np.ndarray]) -> tuple[dict, list[dict]]:
    params, transplant = {}, []
    for torch_name, flax_name in LAYERS.items():
        params[flax_name] = {"kernel": jnp.asarray(np.array(weights[f"{torch_name}.weight"]).T),
                             "bias": jnp.asarray(np.array(weights[f"{torch_name}.bias"]))}
        transplant += [{"target": f"{flax_name}/kernel", "source": f"{torch_name}.weight", "transpose": True},
                       {"target": f"{flax_name}/bias", "source": f"{torch_name}.bias", "transpose": False}]
    return params, transplant


def _to_torch(tree: Any, replicated: bool) -> dict[str, np.ndarray]:
    """Flax tree -> reference names and layouts (replica 0 of a pmap-replicated tree)."""
    pick = (lambda a: np.asarray(a)[0]) if replicated else np.asarray
    out = {}
    for torch_name, flax_name in LAYERS.items():
        out[f"{torch_name}.weight"] = pick(tree[flax_name]["kernel"]).T.copy()
        out[f"{torch_name}.bias"] = pick(tree[flax_name]["bias"]).copy()
    return out


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
    params, transplant = _to_flax(weights)
    mlp = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    outputs = np.asarray(mlp.apply({"params": params}, jnp.asarray(batch["x"][0])))

    class Transplanted(train.MLP):
        def init(self, *a: Any, **k: Any) -> dict:  # type: ignore[override]
            return {"params": params}

    x = batch["x"].reshape(-1, batch["x"].shape[-1])
    y = batch["y"].reshape(-1, batch["y"].shape[-1])
    make_dataset, calls = train.make_dataset, [0]

    def in_order(xt: np.ndarray, yt: np.ndarray, bs: int) -> Any:
        calls[0] += 1
        if calls[0] > 1:  # the second epoch: every fixed batch has been trained on
            raise _Enough
        return ((xt[i:i + bs], yt[i:i + bs]) for i in range(0, len(xt), bs))

    seen: dict[str, Any] = {}
    train.MLP = Transplanted
    raw = make_dataset()  # the port's own: raw float32 features (plus, for some ports, their statistics)
    raw_train = raw[0].astype(np.float64)
    x_raw = (x.astype(np.float64) * raw_train.std(axis=0) + raw_train.mean(axis=0)).astype(np.float32)
    train.make_dataset = lambda: (x_raw, y, *raw[2:])
    train.epoch_batches = in_order
    train.make_train_step = _recording(train.make_train_step, seen)
    try:
        train.main(["--steps", "400"])
    except _Enough:
        pass
    jax.effects_barrier()
    loss = np.asarray(seen["loss"]).reshape(-1)[0]
    replicated = np.asarray(seen["params"]["Dense_0"]["bias"]).ndim == 2
    return {"outputs": outputs, "loss": float(loss), "grads": _to_torch(seen["grads"], False),
            "params": _to_torch(seen["params"], replicated), "transplant": transplant}
