"""The character GPT in Flax (linen): the same network as the PyTorch repo's model.py.

Parity with torch.nn (initialisation and numerics, not bit-exactness):
  - Dense layers are initialised like nn.Linear: kaiming_uniform(a=sqrt(5)) reduces to
    U(-1/sqrt(fan_in), 1/sqrt(fan_in)) for the kernel, and the bias is U(-1/sqrt(fan_in), 1/sqrt(fan_in));
  - token and position embeddings ~ N(0, 1), like nn.Embedding;
  - LayerNorm: torch's eps 1e-5 and the two-pass variance, scale ones and bias zeros;
  - GELU is the exact (erf) one, as nn.GELU(); jax.nn.gelu defaults to the tanh approximation;
  - attention is flax's nn.MultiHeadDotProductAttention with nn.make_causal_mask (t attends to 0..t);
    the head is untied and has no bias.
Submodules keep the torch names where the layer is the same (wte, wpe, h_0.., ln_f, lm_head; mlp's c_fc and
c_proj), so those weights map onto the PyTorch state dict (Dense kernel = Linear weight transposed); the
attention's query/key/value/out kernels are torch's c_attn thirds and c_proj, transposed and split by head.
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


def self_attention(cfg: GPTConfig, name: str) -> nn.MultiHeadDotProductAttention:
    """Flax's own multi-head attention layer in place of the hand-written c_attn / c_proj pair.

    query, key and value are separate DenseGeneral (C -> H x D) layers and `out` maps H x D -> C. torch's
    fused c_attn (C -> 3C) draws all three from U(-1/sqrt(C), 1/sqrt(C)), weights and biases, and c_proj
    has fan_in C too, so one bound fits every kernel and bias here. flax scales the query by 1/sqrt(D)
    and masks with finfo.min: the same softmax as the original's -inf masked_fill.
    """
    init = torch_uniform(cfg.n_embd)
    return nn.MultiHeadDotProductAttention(num_heads=cfg.n_head, qkv_features=cfg.n_embd, out_features=cfg.n_embd,
                                           kernel_init=init, bias_init=init, deterministic=True, name=name)


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
    def __call__(self, x: jax.Array, mask: jax.Array) -> jax.Array:
        x = x + self_attention(self.cfg, "attn")(layer_norm(self.cfg, "ln_1")(x), mask=mask)
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
        mask = nn.make_causal_mask(idx)  # (B, 1, T, T): position t attends to 0..t
        for i in range(cfg.n_layer):
            x = Block(cfg, name=f"h_{i}")(x, mask)
        x = layer_norm(cfg, "ln_f")(x)
        return linear(cfg.vocab_size, cfg.n_embd, "lm_head", use_bias=False)(x)
