"""Parity adapter for dpclass, plain-JAX side in torch's layouts (jax_lax_nchw; ladder/parity/side.py has
the convention).

The dpclass JAX adapter (jax_adam_betas') with the layout conversions removed: this port's parameters
carry torch's names and shapes (OIHW conv weights, GroupNorm weight/bias, the head's (out, in) weight over a
C, H, W flattening) and its images are NCHW, so the reference's weights and batches go in as they are.
It runs the port's own train.main. The adapter only swaps: train.ConvNet is built with dropout off and its
init returns the reference's weights, train.make_dataset returns the fixed global batches as the training
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

MODULES = ("conv1", "norm1", "conv2", "norm2", "head")


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _to_port(weights: Mapping[str, np.ndarray]) -> tuple[dict, list[dict]]:
    params = {m: {"weight": jnp.asarray(np.array(weights[f"{m}.weight"])),
                  "bias": jnp.asarray(np.array(weights[f"{m}.bias"]))} for m in MODULES}
    transplant = [{"target": f"{m}/{p}", "source": f"{m}.{p}", "transpose": False}
                  for p in ("weight", "bias") for m in MODULES]
    return params, transplant


def _to_torch(tree: Any, replicated: bool) -> dict[str, np.ndarray]:
    """Port tree -> reference names (replica 0 of a replicated tree); the layouts are already torch's."""
    t = jax.tree.map(lambda a: np.asarray(a)[0] if replicated else np.asarray(a), tree)
    return {f"{m}.{p}": np.array(t[m][p]) for m in MODULES for p in ("weight", "bias")}


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
    params, transplant = _to_port(weights)
    net = train.ConvNet(train.N_CLASSES, dropout=0.0)
    x0 = jnp.asarray(batch["x"][0])  # NCHW, as the port takes it
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
