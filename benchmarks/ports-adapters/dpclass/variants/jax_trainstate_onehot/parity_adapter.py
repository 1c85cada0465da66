"""Parity adapter for dpclass, JAX/Flax/Optax side, for ports whose step carries a flax TrainState.

jax_adam_betas's adapter (ladder/parity/side.py has the convention) adjusted to train.create_state(model,
params, tx) and make_train_step(model) -> step(state, ...) -> (state, loss): the optimizer is wrapped where
the TrainState is created instead of where the step is made, and the parameters are read from the returned
state.

It runs the port's own train.main. The adapter only swaps: train.ConvNet is built with dropout off and its
init returns the reference's weights (conv kernels OIHW -> HWIO, the head's rows permuted from torch's CHW
flattening to the port's HWC one), train.make_dataset returns the fixed global batches as the training
set and train.global_batches hands them out in order, and the optimizer handed to make_train_step is
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

CONVS, NORMS = ("conv1", "conv2"), ("norm1", "norm2")


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _head_kernel(w: np.ndarray) -> np.ndarray:
    """torch head weight (classes, C*H*W) -> flax kernel (H*W*C, classes), C = 32 and H = W = 4."""
    return w.reshape(w.shape[0], 32, 4, 4).transpose(2, 3, 1, 0).reshape(-1, w.shape[0])


def _head_weight(k: np.ndarray) -> np.ndarray:
    return k.reshape(4, 4, 32, -1).transpose(3, 2, 0, 1).reshape(k.shape[-1], -1)


def _to_flax(weights: Mapping[str, np.ndarray]) -> tuple[dict, list[dict]]:
    w = {k: np.array(weights[k]) for k in weights}
    params = {c: {"kernel": w[f"{c}.weight"].transpose(2, 3, 1, 0), "bias": w[f"{c}.bias"]} for c in CONVS}
    params |= {n: {"scale": w[f"{n}.weight"], "bias": w[f"{n}.bias"]} for n in NORMS}
    params["head"] = {"kernel": _head_kernel(w["head.weight"]), "bias": w["head.bias"]}
    transplant = [{"target": f"{m}/{'kernel' if m not in NORMS else 'scale'}", "source": f"{m}.weight",
                   "transpose": m not in NORMS} for m in (*CONVS, *NORMS, "head")]
    transplant += [{"target": f"{m}/bias", "source": f"{m}.bias", "transpose": False} for m in (*CONVS, *NORMS, "head")]
    return jax.tree.map(jnp.asarray, params), transplant


def _to_torch(tree: Any, replicated: bool) -> dict[str, np.ndarray]:
    """Flax tree -> reference names and layouts (replica 0 of a pmap-replicated tree)."""
    t = jax.tree.map(lambda a: np.asarray(a)[0] if replicated else np.asarray(a), tree)
    out = {}
    for c in CONVS:
        out[f"{c}.weight"], out[f"{c}.bias"] = t[c]["kernel"].transpose(3, 2, 0, 1).copy(), t[c]["bias"]
    for n in NORMS:
        out[f"{n}.weight"], out[f"{n}.bias"] = t[n]["scale"], t[n]["bias"]
    out["head.weight"], out["head.bias"] = _head_weight(t["head"]["kernel"]).copy(), t["head"]["bias"]
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
            seen["params"] = getattr(out[0], "params", out[0])
            return out

        return wrapped

    return make


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    params, transplant = _to_flax(weights)
    net = train.ConvNet(train.N_CLASSES, dropout=0.0)
    x0 = jnp.asarray(batch["x"][0].transpose(0, 2, 3, 1))
    outputs = np.asarray(net.apply({"params": params}, x0, train=False))

    class Transplanted(train.ConvNet):
        def init(self, *a: Any, **k: Any) -> dict:  # type: ignore[override]
            return {"params": params}

    x = batch["x"].reshape(-1, *batch["x"].shape[2:])
    y = batch["y"].reshape(-1)
    make_dataset, global_batches = train.make_dataset, train.global_batches

    def in_order(n: int, seed: int) -> Any:
        shape = next(global_batches(n, seed)).shape  # the port's own index layout, e.g. (replicas, 32)
        yield from np.arange(n).reshape(-1, *shape)
        raise _Enough  # every fixed batch has been trained on

    seen: dict[str, Any] = {}
    train.ConvNet = lambda *a, **k: Transplanted(*a, **{**k, "dropout": 0.0})
    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.global_batches = in_order
    train.make_train_step = _recording(train.make_train_step, seen)
    if hasattr(train, "create_state"):  # the optimizer goes into a TrainState: record its input there
        create_state = train.create_state
        train.create_state = lambda model, p, tx: create_state(model, p, _recording_tx(tx, seen))
    if hasattr(train, "clip_grad_norm"):  # a port that clips by hand before the optimizer: the raw gradient
        clip = train.clip_grad_norm

        def recording_clip(grads: Any, max_norm: float) -> Any:
            jax.debug.callback(lambda g: seen.setdefault("raw", jax.tree.map(np.asarray, g)), grads)
            return clip(grads, max_norm)

        train.clip_grad_norm = recording_clip
    try:
        train.main(["--seed", str(seed), "--steps", "200"])
    except _Enough:
        pass
    jax.effects_barrier()
    loss = np.asarray(seen["loss"]).reshape(-1)[0]
    replicated = np.asarray(seen["params"]["head"]["bias"]).ndim == 2
    return {"outputs": outputs, "loss": float(loss), "grads": _to_torch(seen.get("raw", seen["grads"]), False),
            "params": _to_torch(seen["params"], replicated), "transplant": transplant}
