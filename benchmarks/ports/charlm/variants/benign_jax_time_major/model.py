"""The character GPT in Flax (linen): the same network as the PyTorch repo's model.py.

Parity with torch.nn (initialisation and numerics, not bit-exactness):
  - Dense layers are initialised like nn.Linear: kaiming_uniform(a=sqrt(5)) reduces to
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the kernel, and the bias is U(-1/sqrt(fan_in), 1/sqrt(fan_in));
  - token and position embeddings ~ N(0, 1), like nn.Embedding;
  - LayerNorm: torch's eps 1e-5 and the two-pass variance, scale ones and bias zeros;
  - GELU is the exact (erf) one, as nn.GELU(); jax.nn.gelu defaults to the tanh approximation;
  - the causal mask lets position t attend to 0..t; the head is untied and has no bias.
Submodules keep the torch names (wte, wpe, h_0.., ln_f, lm_head; c_attn, c_proj, c_fc), so
weights map onto the PyTorch state dict (Dense kernel = Linear weight transposed).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import jax
import jax.numpy as jnp
from flax import linen as nn


@dataclass(frozen=True)
class GPTConfig:
    vocab_size: int = 28
    block_size: int = 32
    n_layer: int = 2
    n_head: int = 4
    n_embd: int = 64
    layer_norm_eps: float = 1e-5  # torch.nn.LayerNorm's default; flax's is 1e-6


def torch_uniform(fan_in: int) -> nn.initializers.Initializer:
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


def linear(features: int, fan_in: int, name: str, use_bias: bool = True) -> nn.Dense:
    init = torch_uniform(fan_in)
    return nn.Dense(features, use_bias=use_bias, kernel_init=init, bias_init=init, name=name)


def layer_norm(cfg: GPTConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=cfg.layer_norm_eps, use_fast_variance=False, name=name)


class CausalSelfAttention(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, C = x.shape
        H = self.cfg.n_head
        q, k, v = jnp.split(linear(3 * C, C, "c_attn")(x), 3, axis=-1)
        q = q.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        k = k.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        v = v.reshape(B, T, H, C // H).transpose(0, 2, 1, 3)
        att = (q @ k.transpose(0, 1, 3, 2)) * (1.0 / math.sqrt(C // H))
        causal = jnp.tril(jnp.ones((T, T), dtype=bool))
        att = jnp.where(causal[None, None], att, -jnp.inf)
        att = jax.nn.softmax(att, axis=-1)
        y = (att @ v).transpose(0, 2, 1, 3).reshape(B, T, C)
        return linear(C, C, "c_proj")(y)


class MLP(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        C = self.cfg.n_embd
        x = linear(4 * C, C, "c_fc")(x)
        x = jax.nn.gelu(x, approximate=False)
        return linear(C, 4 * C, "c_proj")(x)


class Block(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = x + CausalSelfAttention(self.cfg, name="attn")(layer_norm(self.cfg, "ln_1")(x))
        return x + MLP(self.cfg, name="mlp")(layer_norm(self.cfg, "ln_2")(x))


class GPT(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, idx: jax.Array, time_major: bool = False) -> jax.Array:
        """idx (B, T) -> logits (B, T, V); with time_major=True, idx (T, B) -> logits (T, B, V)
        (flax.linen.RNN's convention: the layers run batch-major, the ends are transposed)."""
        cfg = self.cfg
        if time_major:
            idx = idx.T
        B, T = idx.shape
        wte = nn.Embed(cfg.vocab_size, cfg.n_embd, embedding_init=nn.initializers.normal(1.0), name="wte")
        wpe = nn.Embed(cfg.block_size, cfg.n_embd, embedding_init=nn.initializers.normal(1.0), name="wpe")
        x = wte(idx) + wpe(jnp.arange(T))[None]
        for i in range(cfg.n_layer):
            x = Block(cfg, name=f"h_{i}")(x)
        x = layer_norm(cfg, "ln_f")(x)
        logits = linear(cfg.vocab_size, cfg.n_embd, "lm_head", use_bias=False)(x)
        return logits.transpose(1, 0, 2) if time_major else logits
