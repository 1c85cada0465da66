"""The character GPT in Flax NNX: the same network as the PyTorch repo's model.py.

NNX modules are stateful Python objects, like torch.nn.Module: parameters are created in
__init__ from an nnx.Rngs and live on the module.

Parity with torch.nn (initialisation and numerics, not bit-exactness):
  - nnx.Linear is initialised like nn.Linear: kaiming_uniform(a=sqrt(5)) reduces to
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the kernel, and the bias is U(-1/sqrt(fan_in), 1/sqrt(fan_in));
  - token and position embeddings ~ N(0, 1), like nn.Embedding (nnx.Embed's default is not);
  - LayerNorm: torch's eps 1e-5 and the two-pass variance, scale ones and bias zeros;
  - GELU is the exact (erf) one, as nn.GELU(); jax.nn.gelu defaults to the tanh approximation;
  - the causal mask lets position t attend to 0..t; the head is untied and has no bias.
Attributes keep the torch names (wte, wpe, h[i], ln_f, lm_head; c_attn, c_proj, c_fc), so the
state maps onto the PyTorch state dict (Linear kernel = torch weight transposed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import nnx


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 28
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    layer_norm_eps: float = 1e-5  # torch.nn.LayerNorm's default; flax's is 1e-6


def torch_uniform(fan_in: int):
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


def linear(fan_in: int, features: int, rngs: nnx.Rngs, use_bias: bool = True) -> nnx.Linear:
    init = torch_uniform(fan_in)
    return nnx.Linear(fan_in, features, use_bias=use_bias, kernel_init=init, bias_init=init, rngs=rngs)


def layer_norm(cfg: GPTConfig, rngs: nnx.Rngs) -> nnx.LayerNorm:
    return nnx.LayerNorm(cfg.n_embd, epsilon=cfg.layer_norm_eps, use_fast_variance=False, rngs=rngs)


class CausalSelfAttention(nnx.Module):
    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs) -> None:
        self.n_head = cfg.n_head
        self.c_attn = linear(cfg.n_embd, 3 * cfg.n_embd, rngs)
        self.c_proj = linear(cfg.n_embd, cfg.n_embd, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, C = x.shape
        H = self.n_head
        q, k, v = jnp.split(self.c_attn(x), 3, axis=-1)
        q = q.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        k = k.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        v = v.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // H))
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        att = jnp.where(causal[None, None], att, -jnp.inf)
        att = jax.nn.softmax(att, axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        return self.c_proj(y)


class MLP(nnx.Module):
    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs) -> None:
        self.c_fc = linear(cfg.n_embd, 4 * cfg.n_embd, rngs)
        self.c_proj = linear(4 * cfg.n_embd, cfg.n_embd, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.c_proj(jax.nn.gelu(self.c_fc(x), approximate=False))


class Block(nnx.Module):
    def __init__(self, cfg: GPTConfig, rngs: nnx.Rngs) -> None:
        self.ln_1 = layer_norm(cfg, rngs)
        self.attn = CausalSelfAttention(cfg, rngs)
        self.ln_2 = layer_norm(cfg, rngs)
        self.mlp = MLP(cfg, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nnx.Module):
    def __init__(self, cfg: GPTConfig, *, rngs: nnx.Rngs) -> None:
        self.cfg = cfg
        normal = nnx.initializers.normal(1.0)
        self.wte = nnx.Embed(cfg.vocab_size, cfg.n_embd, embedding_init=normal, rngs=rngs)
        self.wpe = nnx.Embed(cfg.block_size, cfg.n_embd, embedding_init=normal, rngs=rngs)
        self.h = nnx.List([Block(cfg, rngs) for _ in range(cfg.n_layer)])
        self.ln_f = layer_norm(cfg, rngs)
        self.lm_head = linear(cfg.n_embd, cfg.vocab_size, rngs, use_bias=False)

    def __call__(self, idx: jax.Array) -> jax.Array:
        B, T = idx.shape
        x = self.wte(idx) + self.wpe(jnp.arange(T))[None]
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))
