"""Parity adapter for regress's plain-JAX port with a hand-written SGD (no Flax, no Optax).

ladder/parity/side.py has the convention. The port's parameters are a dict named and laid out like the
reference's state_dict ("net.0.weight" of shape (out, in), ...), built by train.init_mlp(key, ...); its
update is train.sgd_update(grads, momentum, params, lr), which the jitted step from
train.make_train_step() looks up when it is traced; its batches come from
train.epoch_batches(x, y, batch_size, rng). It runs the port's own train.main. The adapter only swaps:
train.init_mlp returns the reference's weights (same names, same layout: no transposes),
train.make_dataset returns the fixed batches as the training set and train.epoch_batches cuts them in
order, and train.sgd_update is wrapped to copy the first gradient it receives to the host. The run stops
after `steps` updates. Loss, gradient, update rule and schedule are the port's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import train

NAMES = ("net.0.weight", "net.0.bias", "net.2.weight", "net.2.bias", "net.4.weight", "net.4.bias")


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _to_host(tree: Any) -> dict[str, np.ndarray]:
    return {k: np.asarray(tree[k]).copy() for k in NAMES}


def _recording_update(update: Any, seen: dict[str, Any]) -> Any:
    """train.sgd_update, with the first gradient it is handed copied to the host."""
    def keep(grads: Any) -> None:
        seen.setdefault("grads", jax.tree.map(np.asarray, grads))

    def recording(grads: Any, *a: Any, **k: Any) -> Any:
        jax.debug.callback(keep, grads)
        return update(grads, *a, **k)

    return recording


def _recording_step(make_train_step: Any, seen: dict[str, Any]) -> Any:
    def make(*args: Any, **kwargs: Any) -> Any:
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
    params = {k: jnp.asarray(np.array(weights[k], dtype=np.float32)) for k in NAMES}
    transplant = [{"target": k, "source": k, "transpose": False} for k in NAMES]
    outputs = np.asarray(train.mlp_apply(params, jnp.asarray(batch["x"][0])))

    x = batch["x"].reshape(-1, batch["x"].shape[-1])
    y = batch["y"].reshape(-1, batch["y"].shape[-1])
    make_dataset, calls = train.make_dataset, [0]

    def in_order(xt: np.ndarray, yt: np.ndarray, bs: int, *_: Any) -> Any:
        calls[0] += 1
        if calls[0] > 1:  # the second epoch: every fixed batch has been trained on
            raise _Enough
        return ((xt[i:i + bs], yt[i:i + bs]) for i in range(0, len(xt), bs))

    seen: dict[str, Any] = {}
    train.init_mlp = lambda *a, **k: params
    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.epoch_batches = in_order
    train.sgd_update = _recording_update(train.sgd_update, seen)
    train.make_train_step = _recording_step(train.make_train_step, seen)
    try:
        train.main(["--steps", "400"])
    except _Enough:
        pass
    jax.effects_barrier()
    loss = np.asarray(seen["loss"]).reshape(-1)[0]
    return {"outputs": outputs, "loss": float(loss), "grads": _to_host(seen["grads"]),
            "params": _to_host(seen["params"]), "transplant": transplant}
