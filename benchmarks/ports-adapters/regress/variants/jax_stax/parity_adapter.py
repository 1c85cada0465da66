"""Parity adapter for regress's jax_stax port (ladder/parity/side.py has the convention).

The regress JAX adapter (variants/benign_jax_normal_init/parity_adapter.py), for a port without Flax or
Optax: the model is jax.example_libraries.stax (train.mlp -> (init_fun, apply_fun), parameters a list
[(W0, b0), (), (W1, b1), (), (W2, b2)] with W = Linear weight transposed) and the optimiser is a
jax.example_libraries.optimizers triple whose opt_update(i, grads, state) is handed to
train.make_train_step(apply_fun, opt_update, get_params). It runs the port's own train.main. The adapter
only swaps: train.mlp's init_fun returns the reference's weights, train.make_dataset returns the fixed
batches as the training set and train.epoch_batches cuts them in order, and opt_update is wrapped to
record the first gradient it receives (before the port's coupled decay, which is inside the optimiser).
The run stops after `steps` updates. Loss, gradient, optimizer and schedule are the port's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

import train

LAYERS = {"net.0": 0, "net.2": 2, "net.4": 4}  # torch name -> index in stax's parameter list


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _to_stax(weights: Mapping[str, np.ndarray]) -> tuple[list, list[dict]]:
    params: list = [()] * 5
    transplant = []
    for torch_name, i in LAYERS.items():
        params[i] = (jnp.asarray(np.array(weights[f"{torch_name}.weight"]).T),
                     jnp.asarray(np.array(weights[f"{torch_name}.bias"])))
        transplant += [{"target": f"{i}/0", "source": f"{torch_name}.weight", "transpose": True},
                       {"target": f"{i}/1", "source": f"{torch_name}.bias", "transpose": False}]
    return params, transplant


def _to_torch(params: list) -> dict[str, np.ndarray]:
    out = {}
    for torch_name, i in LAYERS.items():
        out[f"{torch_name}.weight"] = np.asarray(params[i][0]).T.copy()
        out[f"{torch_name}.bias"] = np.asarray(params[i][1]).copy()
    return out


def _recording_update(opt_update: Any, seen: dict[str, Any]) -> Any:
    """opt_update, with the first gradient it is handed copied to the host (once)."""
    def keep(grads: Any) -> None:
        seen.setdefault("grads", jax.tree.map(np.asarray, grads))

    def update(i: Any, grads: Any, state: Any) -> Any:
        jax.debug.callback(keep, grads)
        return opt_update(i, grads, state)

    return update


def _recording(make_train_step: Any, seen: dict[str, Any]) -> Any:
    def make(apply_fun: Any, opt_update: Any, get_params: Any) -> Any:
        step = make_train_step(apply_fun, _recording_update(opt_update, seen), get_params)

        def wrapped(*a: Any, **k: Any) -> Any:
            out = step(*a, **k)
            seen.setdefault("loss", out[-1])
            seen["params"] = get_params(out[0])
            return out

        return wrapped

    return make


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    params, transplant = _to_stax(weights)
    mlp = train.mlp
    _, apply_fun = mlp(train.N_FEATURES, train.parse_args([]).hidden)
    outputs = np.asarray(apply_fun(params, jnp.asarray(batch["x"][0])))

    def transplanted(*a: Any, **k: Any) -> Any:
        init_fun, apply = mlp(*a, **k)

        def init(key: jax.Array, input_shape: tuple[int, ...]) -> Any:
            out_shape, _ = init_fun(key, input_shape)
            return out_shape, params

        return init, apply

    x = batch["x"].reshape(-1, batch["x"].shape[-1])
    y = batch["y"].reshape(-1, batch["y"].shape[-1])
    make_dataset, calls = train.make_dataset, [0]

    def in_order(xt: np.ndarray, yt: np.ndarray, bs: int) -> Any:
        calls[0] += 1
        if calls[0] > 1:  # the second epoch: every fixed batch has been trained on
            raise _Enough
        return ((xt[i:i + bs], yt[i:i + bs]) for i in range(0, len(xt), bs))

    seen: dict[str, Any] = {}
    train.mlp = transplanted
    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.epoch_batches = in_order
    train.make_train_step = _recording(train.make_train_step, seen)
    try:
        train.main(["--steps", "400"])
    except _Enough:
        pass
    jax.effects_barrier()
    loss = np.asarray(seen["loss"]).reshape(-1)[0]
    return {"outputs": outputs, "loss": float(loss), "grads": _to_torch(seen["grads"]),
            "params": _to_torch(seen["params"]), "transplant": transplant}
