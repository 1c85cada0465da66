"""Parity adapter for charlm's jax_nn_scan_blocks (ladder/parity/side.py has the convention).

The shared JAX adapter (benign_ln_eps's), with one difference in the weight mapping only: this port runs its
blocks as one flax nn.scan, so every block parameter lives under 'h' with a leading layer axis (torch's
h.<i>.attn.c_attn.weight is slice i of params['h']['attn']['c_attn']['kernel'], transposed). The transplant
stacks the reference's per-layer tensors into those leaves and the read-back takes slice i. Everything else
(the swapped init, batches and step count, the gradient read at the optimizer's input) is the shared one's.
The shared adapter's description follows.

Parity adapter for charlm, JAX/Flax/Optax side (ladder/parity/side.py has the convention).

One file for every charlm JAX port (jit, pmap, sharded jit, multi_transform, inject_hyperparams): it runs the
port's own train.main with the reference's arguments (--seed 0 --steps 300, so the hand-set schedule is the
reference's). The adapter only swaps: train.GPT's init returns the reference's weights (Dense kernel = Linear
weight transposed, LayerNorm scale = weight, Embed embedding = weight; torch's h.0 is the port's h_0),
train.get_batch hands out the fixed batches in order, and the optimizer handed to make_train_step is wrapped
to record the gradient it receives (what the port's own loss and, for a data-parallel port, its all-reduce
produced; before the port's clipping, as the reference's p.grad is). The run stops after `steps` updates.
Model, loss, gradient reduction, clipping, AdamW with its decay mask or groups and the schedule are the
port's own: a fault in any of them stays in what this returns. The forward outputs are the port's model
(train.GPT) applied to the first batch. charlm has no dropout.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

import train

ARGV = ["--seed", "0", "--steps", "300", "--eval-every", "100"]  # the reference adapter's


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _layer(name: str) -> int | None:
    """The block index of a torch parameter name (h.<i>.*), None outside the blocks."""
    parts = name.split(".")
    return int(parts[1]) if parts[0] == "h" else None


def _where(name: str) -> tuple[tuple[str, ...], bool]:
    """torch parameter name -> (the port's param-tree path, whether the array is transposed)."""
    parts = name.split(".")
    if parts[0] == "h":  # h.0.attn.c_attn.weight -> h/attn/c_attn, layer 0 of the stacked leaf
        parts = ["h", *parts[2:]]
    module, leaf = parts[:-1], parts[-1]
    if module[-1] in ("wte", "wpe"):
        return (*module, "embedding"), False
    if module[-1].startswith("ln"):
        return (*module, "scale" if leaf == "weight" else "bias"), False
    return (*module, "kernel" if leaf == "weight" else "bias"), leaf == "weight"


def _to_flax(weights: Mapping[str, np.ndarray]) -> tuple[dict, list[dict], list[str]]:
    names = list(weights)
    params: dict = {}
    transplant = []
    stacked: dict[tuple[str, ...], dict[int, np.ndarray]] = {}
    for name in names:
        path, transpose = _where(name)
        w = np.array(weights[name])
        w = w.T.copy() if transpose else w
        layer = _layer(name)
        if layer is not None:
            stacked.setdefault(path, {})[layer] = w
            transplant.append({"target": "/".join(path) + f"[{layer}]", "source": name, "transpose": transpose})
            continue
        node = params
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = jnp.asarray(w)
        transplant.append({"target": "/".join(path), "source": name, "transpose": transpose})
    for path, layers in stacked.items():
        node = params
        for p in path[:-1]:
            node = node.setdefault(p, {})
        node[path[-1]] = jnp.asarray(np.stack([layers[i] for i in range(len(layers))]))
    return params, transplant, names


def _to_torch(tree: Any, names: list[str], replicated: bool) -> dict[str, np.ndarray]:
    """The port's tree -> reference names and layouts (replica 0 of a pmap-replicated tree)."""
    out = {}
    for name in names:
        path, transpose = _where(name)
        node = tree
        for p in path:
            node = node[p]
        a = np.asarray(node)
        a = a[0] if replicated else a
        layer = _layer(name)
        a = a[layer] if layer is not None else a
        out[name] = a.T.copy() if transpose else a
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
    params, transplant, names = _to_flax(weights)
    gpt = train.GPT
    _, _, vocab = train.make_dataset()
    model = gpt(train.GPTConfig(vocab_size=len(vocab), block_size=train.BLOCK_SIZE))
    outputs = np.asarray(model.apply({"params": params}, jnp.asarray(batch["x"][0].astype(np.int32))))

    class Transplanted(gpt):
        def init(self, *a: Any, **k: Any) -> dict:  # type: ignore[override]
            return {"params": params}

    pairs = iter(zip(batch["x"], batch["y"]))

    def fixed(*a: Any, **k: Any) -> tuple[np.ndarray, np.ndarray]:
        try:
            return next(pairs)
        except StopIteration:
            raise _Enough from None  # every fixed batch has been trained on

    seen: dict[str, Any] = {}
    train.GPT = lambda *a, **k: Transplanted(*a, **k)
    train.get_batch = fixed
    train.make_train_step = _recording(train.make_train_step, seen)
    try:
        train.main(ARGV)
    except _Enough:
        pass
    jax.effects_barrier()
    loss = np.asarray(seen["loss"]).reshape(-1)[0]
    replicated = np.asarray(seen["params"]["ln_f"]["bias"]).ndim == 2
    return {"outputs": outputs, "loss": float(loss), "grads": _to_torch(seen["grads"], names, False),
            "params": _to_torch(seen["params"], names, replicated), "transplant": transplant}
