"""Parity adapter for regress, JAX side written with Flax NNX (nnx.Module + nnx.Optimizer).

fault_jax_nnx_bias_variable's copy of jax_nnx's adapter, for a port whose layer biases may not be
nnx.Param variables: a bias that receives no gradient is reported with a zero gradient, and the
parameters after the run are read from all of the model's variables (nnx.state(model)), not only its
nnx.Param ones. Otherwise as jax_nnx's:

ladder/parity/side.py has the convention. It runs the port's own train.main. The adapter only swaps:
train.MLP builds the port's module and then holds the reference's weights (an nnx.Linear kernel = the
nn.Linear weight transposed), train.make_dataset returns the fixed batches as the training set and
train.epoch_batches cuts them in order, and the optax transformation train.make_tx builds is wrapped to
copy the first gradient it receives to the host. train.train_step is wrapped only to keep the first loss
and the model it updated. The run stops after `steps` updates. Loss, gradient, optimizer and schedule
are the port's own.
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

LAYERS = {"net.0": "fc1", "net.2": "fc2", "net.4": "fc3"}  # torch name -> nnx attribute


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _pure(tree: Any) -> Any:
    """nnx.State / Variables / dicts -> nested dicts of numpy arrays."""
    if isinstance(tree, nnx.State):
        tree = nnx.to_pure_dict(tree)
    if isinstance(tree, Mapping):
        return {k: _pure(v) for k, v in tree.items()}
    return np.asarray(getattr(tree, "value", tree))


def _to_torch(tree: Any, like: Mapping[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Reference names and layouts; a leaf missing from `tree` is zeros shaped as in `like`."""
    tree = _pure(tree)
    out = {}
    for torch_name, layer in LAYERS.items():
        for leaf, name, flip in (("kernel", f"{torch_name}.weight", True), ("bias", f"{torch_name}.bias", False)):
            if leaf in tree.get(layer, {}):
                value = np.asarray(tree[layer][leaf])
                out[name] = (value.T if flip else value).copy()
            elif like is not None:
                out[name] = np.zeros_like(np.asarray(like[name]), dtype=np.float32)
            else:
                raise KeyError(f"{layer}/{leaf}")
    return out


def _recording_tx(tx: optax.GradientTransformation, seen: dict[str, Any],
                  like: Mapping[str, np.ndarray]) -> optax.GradientTransformation:
    def keep(grads: Any) -> None:
        seen.setdefault("grads", _to_torch(grads, like))

    def update(grads: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        jax.debug.callback(keep, grads)
        return tx.update(grads, state, params, **extra)

    return optax.GradientTransformation(tx.init, update)


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    transplant = []
    for torch_name, layer in LAYERS.items():
        transplant += [{"target": f"{layer}/kernel", "source": f"{torch_name}.weight", "transpose": True},
                       {"target": f"{layer}/bias", "source": f"{torch_name}.bias", "transpose": False}]
    mlp = train.MLP

    class Transplanted(mlp):  # type: ignore[misc, valid-type]
        def __init__(self, *a: Any, **k: Any) -> None:
            super().__init__(*a, **k)
            for torch_name, layer in LAYERS.items():
                lin = getattr(self, layer)
                lin.kernel.value = jnp.asarray(np.array(weights[f"{torch_name}.weight"]).T)
                lin.bias.value = jnp.asarray(np.array(weights[f"{torch_name}.bias"]))

    probe = Transplanted(train.N_FEATURES, train.parse_args([]).hidden, rngs=nnx.Rngs(0))
    outputs = np.asarray(probe(jnp.asarray(batch["x"][0])))

    x = batch["x"].reshape(-1, batch["x"].shape[-1])
    y = batch["y"].reshape(-1, batch["y"].shape[-1])
    make_dataset, make_tx, train_step, calls = train.make_dataset, train.make_tx, train.train_step, [0]

    def in_order(xt: np.ndarray, yt: np.ndarray, bs: int) -> Any:
        calls[0] += 1
        if calls[0] > 1:  # the second epoch: every fixed batch has been trained on
            raise _Enough
        return ((xt[i:i + bs], yt[i:i + bs]) for i in range(0, len(xt), bs))

    seen: dict[str, Any] = {}

    def recording_step(model: Any, *a: Any, **k: Any) -> Any:
        loss = train_step(model, *a, **k)
        seen.setdefault("loss", loss)
        seen["model"] = model
        return loss

    train.MLP = Transplanted
    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.epoch_batches = in_order
    train.make_tx = lambda *a, **k: _recording_tx(make_tx(*a, **k), seen, weights)
    train.train_step = recording_step
    try:
        train.main(["--steps", "400"])
    except _Enough:
        pass
    jax.effects_barrier()
    loss = np.asarray(seen["loss"]).reshape(-1)[0]
    return {"outputs": outputs, "loss": float(loss), "grads": seen["grads"],
            "params": _to_torch(nnx.state(seen["model"])), "transplant": transplant}
