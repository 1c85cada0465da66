"""Parity adapter for charlm's jax_flax_mha port (flax's nn.MultiHeadDotProductAttention), JAX side.

benign_ln_eps's adapter with the attention's weights mapped: torch's fused c_attn (3C, C) is cut into its
query / key / value thirds, each transposed to a DenseGeneral kernel (C, H, D) with a bias (H, D); torch's
c_proj (C, C) becomes the `out` kernel (H, D, C) and bias (C,). Gradients and parameters come back the same
way, concatenated into c_attn's layout. Everything else as in the shared JAX adapter: it runs the
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


ATTN = ("query", "key", "value")


def _where(name: str) -> tuple[tuple[str, ...], bool]:
    """torch parameter name (outside attention) -> (the port's param-tree path, whether transposed)."""
    parts = name.split(".")
    if parts[0] == "h":  # h.0.mlp.c_fc.weight -> h_0/mlp/c_fc
        parts = [f"h_{parts[1]}", *parts[2:]]
    module, leaf = parts[:-1], parts[-1]
    if module[-1] in ("wte", "wpe"):
        return (*module, "embedding"), False
    if module[-1].startswith("ln"):
        return (*module, "scale" if leaf == "weight" else "bias"), False
    return (*module, "kernel" if leaf == "weight" else "bias"), leaf == "weight"


def _attn(name: str) -> tuple[str, str, str] | None:
    """'h.0.attn.c_attn.weight' -> ('h_0', 'c_attn', 'weight'); None outside attention."""
    parts = name.split(".")
    if len(parts) == 5 and parts[0] == "h" and parts[2] == "attn":
        return f"h_{parts[1]}", parts[3], parts[4]
    return None


def _set(tree: dict, path: tuple[str, ...], value: Any) -> None:
    node = tree
    for p in path[:-1]:
        node = node.setdefault(p, {})
    node[path[-1]] = value


def _get(tree: Any, path: tuple[str, ...]) -> Any:
    for p in path:
        tree = tree[p]
    return tree


def _heads() -> tuple[int, int]:
    cfg = train.GPTConfig()
    return cfg.n_head, cfg.n_embd // cfg.n_head


def _to_flax(weights: Mapping[str, np.ndarray]) -> tuple[dict, list[dict], list[str]]:
    names = list(weights)
    H, D = _heads()
    params: dict = {}
    transplant = []
    for name in names:
        w = np.array(weights[name])
        attn = _attn(name)
        if attn is None:
            path, transpose = _where(name)
            _set(params, path, jnp.asarray(w.T.copy() if transpose else w))
            transplant.append({"target": "/".join(path), "source": name, "transpose": transpose})
            continue
        block, layer, leaf = attn
        C = w.shape[-1] if leaf == "weight" else w.shape[0] // (3 if layer == "c_attn" else 1)
        if layer == "c_attn":
            for j, part in enumerate(ATTN):
                piece = w[j * C : (j + 1) * C]
                value = piece.T.reshape(C, H, D) if leaf == "weight" else piece.reshape(H, D)
                path = (block, "attn", part, "kernel" if leaf == "weight" else "bias")
                _set(params, path, jnp.asarray(value.copy()))
                transplant.append({"target": "/".join(path), "source": name, "transpose": leaf == "weight"})
        else:  # c_proj -> out
            value = w.T.reshape(H, D, C) if leaf == "weight" else w
            path = (block, "attn", "out", "kernel" if leaf == "weight" else "bias")
            _set(params, path, jnp.asarray(value.copy()))
            transplant.append({"target": "/".join(path), "source": name, "transpose": leaf == "weight"})
    return params, transplant, names


def _to_torch(tree: Any, names: list[str], replicated: bool) -> dict[str, np.ndarray]:
    """The port's tree -> reference names and layouts."""
    out = {}
    for name in names:
        attn = _attn(name)
        if attn is None:
            path, transpose = _where(name)
            a = np.asarray(_get(tree, path))
            a = a[0] if replicated else a
            out[name] = a.T.copy() if transpose else a
            continue
        block, layer, leaf = attn
        key = "kernel" if leaf == "weight" else "bias"
        if layer == "c_attn":
            pieces = []
            for part in ATTN:
                a = np.asarray(_get(tree, (block, "attn", part, key)))
                a = a[0] if replicated else a
                pieces.append(a.reshape(a.shape[0], -1).T if leaf == "weight" else a.reshape(-1))
            out[name] = np.concatenate(pieces, axis=0)
        else:
            a = np.asarray(_get(tree, (block, "attn", "out", key)))
            a = a[0] if replicated else a
            out[name] = a.reshape(-1, a.shape[-1]).T.copy() if leaf == "weight" else a
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
