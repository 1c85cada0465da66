"""The character GPT as plain JAX functions: no Flax, a flat dict of arrays keyed by the PyTorch names.

A "minGPT in pure JAX" port of the PyTorch repo's model.py:
  - parameters live in one flat dict whose keys are the torch state-dict names ("wte.weight",
    "h.0.attn.c_attn.weight", ...) and whose arrays keep torch's layouts (a Linear weight is
    (out_features, in_features), applied as x @ W.T + b), so a torch checkpoint loads as is;
  - init_params draws them like torch's defaults: Linear weight and bias U(-1/sqrt(fan_in), 1/sqrt(fan_in))
    (kaiming_uniform(a=sqrt(5)) reduces to that bound), Embedding N(0, 1), LayerNorm ones and zeros;
  - LayerNorm with torch's eps 1e-5 (biased variance), exact erf GELU, causal mask 0..t,
    untied head without bias; no dropout.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp

Params = dict[str, jax.Array]


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 28
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    layer_norm_eps: float = 1e-5


def param_shapes(cfg: GPTConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter's name and torch shape, in torch's registration order."""
    C, V = cfg.n_embd, cfg.vocab_size
    shapes: dict[str, tuple[int, ...]] = {"wte.weight": (V, C), "wpe.weight": (cfg.block_size, C)}
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        shapes.update({
            p + "ln_1.weight": (C,), p + "ln_1.bias": (C,),
            p + "attn.c_attn.weight": (3 * C, C), p + "attn.c_attn.bias": (3 * C,),
            p + "attn.c_proj.weight": (C, C), p + "attn.c_proj.bias": (C,),
            p + "ln_2.weight": (C,), p + "ln_2.bias": (C,),
            p + "mlp.c_fc.weight": (4 * C, C), p + "mlp.c_fc.bias": (4 * C,),
            p + "mlp.c_proj.weight": (C, 4 * C), p + "mlp.c_proj.bias": (C,),
        })
    shapes.update({"ln_f.weight": (C,), "ln_f.bias": (C,), "lm_head.weight": (V, C)})
    return shapes


def init_params(key: jax.Array, cfg: GPTConfig) -> Params:
    """torch's default initialisation, one key per parameter."""
    shapes = param_shapes(cfg)
    keys = jax.random.split(key, len(shapes))
    params: Params = {}
    fan_in: dict[str, int] = {}
    for name, shape in shapes.items():  # a Linear's bias takes its weight's fan_in
        if name.endswith(".weight") and len(shape) == 2:
            fan_in[name[: -len(".weight")]] = shape[1]
    for k, (name, shape) in zip(keys, shapes.items()):
        module = name.rsplit(".", 1)[0]
        if module in ("wte", "wpe"):
            params[name] = jax.random.normal(k, shape, jnp.float32)
        elif module.split(".")[-1].startswith("ln"):
            params[name] = jnp.ones(shape) if name.endswith("weight") else jnp.zeros(shape)
        else:
            bound = 1.0 / math.sqrt(fan_in[module])
            params[name] = jax.random.uniform(k, shape, jnp.float32, -bound, bound)
    return params


def linear(params: Params, name: str, x: jax.Array) -> jax.Array:
    y = x @ params[name + ".weight"].T
    bias = params.get(name + ".bias")
    return y if bias is None else y + bias


def layer_norm(params: Params, name: str, x: jax.Array, eps: float) -> jax.Array:
    mean = x.mean(-1, keepdims=True)
    var = jnp.square(x - mean).mean(-1, keepdims=True)
    return (x - mean) * jax.lax.rsqrt(var + eps) * params[name + ".weight"] + params[name + ".bias"]


def attention(params: Params, name: str, x: jax.Array, n_head: int) -> jax.Array:
    B, T, C = x.shape
    q, k, v = jnp.split(linear(params, name + ".c_attn", x), 3, axis=-1)
    q = q.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)
    k = k.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)
    v = v.reshape(B, T, n_head, C // n_head).transpose(0, 2, 1, 3)
    att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // n_head))
    causal = jnp.tril(jnp.ones((T, T), dtype=bool))
    att = jax.nn.softmax(jnp.where(causal, att, -jnp.inf), axis=-1)
    y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
    return linear(params, name + ".c_proj", y)


def mlp(params: Params, name: str, x: jax.Array) -> jax.Array:
    h = jax.nn.gelu(linear(params, name + ".c_fc", x), approximate=False)
    return linear(params, name + ".c_proj", h)


def forward(params: Params, idx: jax.Array, cfg: GPTConfig) -> jax.Array:
    """Logits (B, T, vocab) for token ids (B, T)."""
    T = idx.shape[1]
    x = params["wte.weight"][idx] + params["wpe.weight"][:T][None]
    for i in range(cfg.n_layer):
        p = f"h.{i}."
        x = x + attention(params, p + "attn", layer_norm(params, p + "ln_1", x, cfg.layer_norm_eps), cfg.n_head)
        x = x + mlp(params, p + "mlp", layer_norm(params, p + "ln_2", x, cfg.layer_norm_eps))
    x = layer_norm(params, "ln_f", x, cfg.layer_norm_eps)
    return linear(params, "lm_head", x)
