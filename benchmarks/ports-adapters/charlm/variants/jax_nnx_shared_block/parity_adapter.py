"""Parity adapter for charlm, JAX/Flax NNX side, for an NNX port whose module graph may share a submodule
between several attribute paths (jax_nnx_shared_block: h[0] and h[1] are one Block object). It is jax_nnx's
adapter with two changes. (1) The count check allows shared variables: nnx.state lists a shared Variable
once, so the port may hold fewer Param leaves than the reference has parameters; every reference name must
still resolve to a Param of the right shape. (2) A reference name whose block is the same object as an
earlier one (h[1] is h[0]) is read from that earlier path in the port's gradient and parameter states, which
is where NNX files a shared Variable. The transplant writes every reference tensor into the Variable its name
resolves to, in the reference's order, so a shared Variable ends up holding the last one written (h.1's).
Everything else is jax_nnx's: train.GPT returns the port's model with the reference's weights written in,
train.get_batch hands out the fixed batches in order, the optimizer train.make_tx builds is wrapped to record
the gradient it receives, train.train_step is wrapped to keep the first loss, the run stops after `steps`
updates, and the parameters are read from the model object the optimizer updated in place.
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

ARGV = ["--seed", "0", "--steps", "300", "--eval-every", "100"]  # the reference adapter's


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _where(name: str) -> tuple[tuple[Any, ...], bool]:
    """torch parameter name -> (the port's attribute path, whether the array is transposed)."""
    parts: list[Any] = name.split(".")
    if parts[0] == "h":  # h.0.attn.c_attn.weight -> h[0].attn.c_attn
        parts[1] = int(parts[1])
    module, leaf = parts[:-1], parts[-1]
    if module[-1] in ("wte", "wpe"):
        return (*module, "embedding"), False
    if str(module[-1]).startswith("ln"):
        return (*module, "scale" if leaf == "weight" else "bias"), False
    return (*module, "kernel" if leaf == "weight" else "bias"), leaf == "weight"


def _variable(model: Any, path: tuple[Any, ...]) -> nnx.Variable:
    node = model
    for p in path:
        node = node[p] if isinstance(p, int) else getattr(node, p)
    return node


def _key(path: Any) -> str:
    """A jax key path of an nnx.State -> 'h/0/attn/c_attn/kernel' (the Variable's own 'value' dropped)."""
    out = []
    for k in path:
        for attr in ("key", "idx", "name"):
            if hasattr(k, attr):
                out.append(str(getattr(k, attr)))
                break
    while out and out[-1] in ("value", "raw_value"):
        out.pop()
    return "/".join(out)


def _flat(tree: Any) -> dict[str, np.ndarray]:
    return {_key(p): np.asarray(v) for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def _transplant(model: Any, arrays: Mapping[str, np.ndarray]) -> Any:
    for name, w in arrays.items():
        path, transpose = _where(name)
        var = _variable(model, path)
        new = jnp.asarray(w.T.copy() if transpose else w)
        assert var.value.shape == new.shape, (name, var.value.shape, new.shape)
        var.value = new
    return model


def _recording_tx(tx: optax.GradientTransformation, seen: dict[str, Any]) -> optax.GradientTransformation:
    """tx, with the first gradient it is handed copied to the host (once)."""
    def keep(grads: Any) -> None:
        seen.setdefault("grads", grads)

    def update(grads: Any, state: Any, params: Any = None, **extra: Any) -> Any:
        jax.debug.callback(keep, _flat_traced(grads))
        return tx.update(grads, state, params, **extra)

    return optax.GradientTransformation(tx.init, update)


def _flat_traced(tree: Any) -> dict[str, Any]:
    return {_key(p): v for p, v in jax.tree_util.tree_leaves_with_path(tree)}


def _canonical(model: Any, path: tuple[Any, ...]) -> tuple[Any, ...]:
    """The path NNX files a Variable under: h[i] -> h[j] for the first j whose block is the same object."""
    if path[0] == "h" and isinstance(path[1], int):
        first = next(j for j in range(len(model.h)) if model.h[j] is model.h[path[1]])
        return ("h", first, *path[2:])
    return path


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    names = list(weights)
    arrays = {name: np.array(weights[name]) for name in names}
    transplant = []
    for name in names:
        path, transpose = _where(name)
        transplant.append({"target": "/".join(map(str, path)), "source": name, "transpose": transpose})

    gpt = train.GPT
    _, _, vocab = train.make_dataset()
    cfg = train.GPTConfig(vocab_size=len(vocab), block_size=train.BLOCK_SIZE)
    probe = _transplant(gpt(cfg, rngs=nnx.Rngs(0)), arrays)
    n_params = len(jax.tree_util.tree_leaves(nnx.state(probe, nnx.Param)))
    assert 0 < n_params <= len(names), (n_params, len(names))
    outputs = np.asarray(probe(jnp.asarray(batch["x"][0].astype(np.int32))))

    seen: dict[str, Any] = {}
    built: dict[str, Any] = {}

    def model(*a: Any, **k: Any) -> Any:
        built["model"] = _transplant(gpt(*a, **k), arrays)
        return built["model"]

    pairs = iter(zip(batch["x"], batch["y"]))

    def fixed(*a: Any, **k: Any) -> tuple[np.ndarray, np.ndarray]:
        try:
            return next(pairs)
        except StopIteration:
            raise _Enough from None  # every fixed batch has been trained on

    make_tx, train_step = train.make_tx, train.train_step

    def recording_step(*a: Any, **k: Any) -> Any:
        loss = train_step(*a, **k)
        seen.setdefault("loss", loss)
        return loss

    train.GPT = model
    train.get_batch = fixed
    train.make_tx = lambda *a, **k: _recording_tx(make_tx(*a, **k), seen)
    train.train_step = recording_step
    try:
        train.main(ARGV)
    except _Enough:
        pass
    jax.effects_barrier()
    grads = {k: np.asarray(v) for k, v in seen["grads"].items()}
    params = _flat(nnx.state(built["model"], nnx.Param))
    out_grads, out_params = {}, {}
    for name in names:
        path, transpose = _where(name)
        key = "/".join(map(str, _canonical(built["model"], path)))
        g, p = grads[key], params[key]
        out_grads[name] = g.T.copy() if transpose else g
        out_params[name] = p.T.copy() if transpose else p
    return {"outputs": outputs, "loss": float(np.asarray(seen["loss"])), "grads": out_grads,
            "params": out_params, "transplant": transplant}
