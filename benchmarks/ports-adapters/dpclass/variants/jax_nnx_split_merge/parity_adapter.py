"""Parity adapter for dpclass, JAX/Flax NNX/Optax side (ladder/parity/side.py has the convention).

The jax_nnx adapter for a port written in Flax NNX's functional style: the model (and nnx.Optimizer) are
nnx.split once in train.main, and the step is the module-level jax.jit function
train.train_step(graphdef, ..., state, ..., x, y) -> (loss, new state), its first argument the static
GraphDef of what its returned state is the state of (the model and the optimizer, or the model alone). It runs the port's own train.main. The adapter
only swaps: train.ConvNet returns an NNX model built with dropout off and holding the reference's weights
(conv kernels OIHW -> HWIO, the head's rows permuted from torch's CHW flattening to the port's HWC one),
train.make_dataset returns the fixed global batches as the training set and train.global_batches hands
them out in order, the optimizer made by train.make_tx is wrapped to record the gradient it receives
(what the port's own loss produced), and train.train_step is wrapped to record the first loss and keep the last returned state. The run
stops after `steps` updates; the parameters are read from nnx.merge(graphdef, last state). Loss, gradient, optimizer and
schedule are the port's own.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

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
    """Reference weights -> the NNX model's parameter tree (a pure dict: module -> kernel/bias/scale)."""
    w = {k: np.array(weights[k]) for k in weights}
    params = {c: {"kernel": w[f"{c}.weight"].transpose(2, 3, 1, 0), "bias": w[f"{c}.bias"]} for c in CONVS}
    params |= {n: {"scale": w[f"{n}.weight"], "bias": w[f"{n}.bias"]} for n in NORMS}
    params["head"] = {"kernel": _head_kernel(w["head.weight"]), "bias": w["head.bias"]}
    transplant = [{"target": f"{m}/{'kernel' if m not in NORMS else 'scale'}", "source": f"{m}.weight",
                   "transpose": m not in NORMS} for m in (*CONVS, *NORMS, "head")]
    transplant += [{"target": f"{m}/bias", "source": f"{m}.bias", "transpose": False} for m in (*CONVS, *NORMS, "head")]
    return params, transplant


def _pure(tree: Any) -> dict:
    """An nnx.State (or a pure dict of arrays / Variables) -> {module: {name: np.ndarray}}."""
    if hasattr(tree, "to_pure_dict"):
        tree = tree.to_pure_dict()
    return {m: {k: np.asarray(getattr(v, "value", v)) for k, v in leaves.items()} for m, leaves in tree.items()}


def _to_torch(tree: Any) -> dict[str, np.ndarray]:
    """NNX parameter tree -> reference names and layouts."""
    t = _pure(tree)
    out = {}
    for c in CONVS:
        out[f"{c}.weight"], out[f"{c}.bias"] = t[c]["kernel"].transpose(3, 2, 0, 1).copy(), t[c]["bias"]
    for n in NORMS:
        out[f"{n}.weight"], out[f"{n}.bias"] = t[n]["scale"], t[n]["bias"]
    out["head.weight"], out["head.bias"] = _head_weight(t["head"]["kernel"]).copy(), t["head"]["bias"]
    return out


def _transplanted(params: dict) -> Any:
    """An NNX ConvNet with dropout off, its parameters replaced by the given tree."""
    model = train.ConvNet(train.N_CLASSES, dropout=0.0, rngs=nnx.Rngs(0))
    state = nnx.state(model, nnx.Param)
    state.replace_by_pure_dict(jax.tree.map(jnp.asarray, params))
    nnx.update(model, state)
    return model


def _recording_tx(tx: optax.GradientTransformation, seen: dict[str, Any]) -> optax.GradientTransformation:
    """tx, with the first gradient it is handed copied to the host (once)."""
    def keep(grads: Any) -> None:
        seen.setdefault("grads", _pure(grads))

    def update(grads: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        jax.debug.callback(keep, grads)
        return tx.update(grads, state, params, **extra)

    return optax.GradientTransformation(tx.init, update)


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    params, transplant = _to_flax(weights)
    model = _transplanted(params)
    model.eval()
    outputs = np.asarray(model(jnp.asarray(batch["x"][0].transpose(0, 2, 3, 1))))
    model.train()

    x = batch["x"].reshape(-1, *batch["x"].shape[2:])
    y = batch["y"].reshape(-1)
    make_dataset, global_batches = train.make_dataset, train.global_batches
    make_tx, train_step = train.make_tx, train.train_step

    def in_order(n: int, seed: int) -> Any:
        shape = next(global_batches(n, seed)).shape
        yield from np.arange(n).reshape(-1, *shape)
        raise _Enough  # every fixed batch has been trained on

    seen: dict[str, Any] = {}

    def recording_step(*a: Any, **k: Any) -> Any:
        out = train_step(*a, **k)
        seen.setdefault("loss", out[0])
        seen["last"] = (a[0], out[1])  # the step donates its state input: only the last one is kept
        return out

    train.ConvNet = lambda *a, **k: model
    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.global_batches = in_order
    train.make_tx = lambda *a, **k: _recording_tx(make_tx(*a, **k), seen)
    train.train_step = recording_step
    try:
        train.main(["--seed", str(seed), "--steps", "200"])
    except _Enough:
        pass
    jax.effects_barrier()
    merged = nnx.merge(*seen["last"])
    model = merged[0] if isinstance(merged, tuple) else merged
    return {"outputs": outputs, "loss": float(np.asarray(seen["loss"]).reshape(-1)[0]),
            "grads": _to_torch(seen["grads"]), "params": _to_torch(nnx.state(model, nnx.Param)),
            "transplant": transplant}
