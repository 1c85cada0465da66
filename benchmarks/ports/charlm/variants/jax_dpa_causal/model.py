"""The character GPT in Flax (linen): the same network as the PyTorch repo's model.py.

Parity with torch.nn (initialisation and numerics, not bit-exactness):
  - Dense kernels are initialised like nn.Linear's weight, written with flax's own initialiser:
    nn.Linear calls kaiming_uniform_(a=sqrt(5)), whose gain^2 is 2 / (1 + 5) = 1/3, i.e.
    variance_scaling(1/3, "fan_in", "uniform") = U(-1/sqrt(fan_in), 1/sqrt(fan_in)); flax's kernel is
    (in, out), so its fan_in axis (-2) is the Linear's in_features. (flax's own kaiming_uniform() is
    variance_scaling(2.0, ...), torch's kaiming_uniform_ with a=0: NOT what nn.Linear uses.) The bias is
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) as nn.Linear draws it (variance_scaling needs a 2-D shape);
  - attention is jax.nn.dot_product_attention(q, k, v, is_causal=True), the JAX counterpart of torch's
    F.scaled_dot_product_attention; it takes (batch, seq, heads, head_dim), not torch's
    (batch, heads, seq, head_dim), so q, k and v are only reshaped, never transposed; its default scale is
    1/sqrt(head_dim), as the original's;
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


# nn.Linear's weight init: kaiming_uniform_(a=sqrt(5)) -> gain^2 = 2 / (1 + a^2) = 1/3 over fan_in.
TORCH_LINEAR_KERNEL = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def linear(features: int, fan_in: int, name: str, use_bias: bool = True) -> nn.Dense:
    return nn.Dense(features, use_bias=use_bias, kernel_init=TORCH_LINEAR_KERNEL, bias_init=torch_uniform(fan_in),
                    name=name)


def layer_norm(cfg: GPTConfig, name: str) -> nn.LayerNorm:
    return nn.LayerNorm(epsilon=cfg.layer_norm_eps, use_fast_variance=False, name=name)


class CausalSelfAttention(nn.Module):
    cfg: GPTConfig

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        B, T, C = x.shape
        H = self.cfg.n_head
        q, k, v = jnp.split(linear(3 * C, C, "c_attn")(x), 3, axis=-1)
        # jax.nn.dot_product_attention's layout is (B, T, heads, head_dim): a reshape, no transpose.
        q = q.reshape(B, T, H, C // H)
        k = k.reshape(B, T, H, C // H)
        v = v.reshape(B, T, H, C // H)
        y = jax.nn.dot_product_attention(q, k, v, is_causal=True, implementation="xla")
        return linear(C, C, "c_proj")(y.reshape(B, T, C))


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
    def __call__(self, idx: jax.Array) -> jax.Array:
        cfg = self.cfg
        B, T = idx.shape
        wte = nn.Embed(cfg.vocab_size, cfg.n_embd, embedding_init=nn.initializers.normal(1.0), name="wte")
        wpe = nn.Embed(cfg.block_size, cfg.n_embd, embedding_init=nn.initializers.normal(1.0), name="wpe")
        x = wte(idx) + wpe(jnp.arange(T))[None]
        for i in range(cfg.n_layer):
            x = Block(cfg, name=f"h_{i}")(x)
        x = layer_norm(cfg, "ln_f")(x)
        return linear(cfg.vocab_size, cfg.n_embd, "lm_head", use_bias=False)(x)
