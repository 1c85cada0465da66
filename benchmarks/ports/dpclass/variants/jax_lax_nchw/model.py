"""The classifier in plain JAX (jax.lax, no Flax), in PyTorch's layouts: the reference's ConvNet.

Everything torch's modules do by default is written out, because none of it comes from a
framework here:
  - NCHW activations and OIHW conv kernels (jax.lax.conv_general_dilated with
    dimension_numbers ("NCHW", "OIHW", "NCHW")), explicit padding ((1, 1), (1, 1)) for
    Conv2d(..., 3, padding=1), stride 1;
  - max-pooling F.max_pool2d(x, 2): window 2x2 AND stride 2x2 (torch's stride defaults to the
    window; a reduce_window stride must be given), no padding;
  - GroupNorm(4, C): per sample and group, mean and biased variance over the group's channels
    and H, W, eps 1e-5, per-channel weight 1 and bias 0;
  - the head Linear(512, 8) as x @ weight.T + bias with weight (8, 512) = (out, in), over the
    feature map flattened in C, H, W order (torch's x.flatten(1));
  - torch's default init for Conv2d and Linear: weight and bias ~ U(-1/sqrt(fan_in),
    1/sqrt(fan_in)), fan_in = in_channels * kh * kw (OIHW: shape[1] * shape[2] * shape[3]);
  - inverted dropout (p = 0.2, kept units scaled by 1 / 0.8) in training only.

The parameters are a dict {"conv1": {"weight", "bias"}, "norm1": {"weight", "bias"}, ...} with
torch's names and shapes. ConvNet.init / ConvNet.apply follow the calling convention of a Flax
module ({"params": ...} in and out, train flag, rngs={"dropout": key}), so train.py reads like
the other JAX ports.
"""

from __future__ import annotations

import math
from typing import Any

import jax
import jax.numpy as jnp

GROUP_NORM_EPS = 1e-5  # torch.nn.GroupNorm default
CONV_DIMS = ("NCHW", "OIHW", "NCHW")  # torch's layouts


def _uniform(key: jax.Array, shape: tuple[int, ...], fan_in: int) -> jax.Array:
    bound = 1.0 / math.sqrt(fan_in)
    return jax.random.uniform(key, shape, jnp.float32, minval=-bound, maxval=bound)


def conv3x3(x: jax.Array, p: dict[str, jax.Array]) -> jax.Array:
    y = jax.lax.conv_general_dilated(
        x, p["weight"], window_strides=(1, 1), padding=((1, 1), (1, 1)), dimension_numbers=CONV_DIMS
    )
    return y + p["bias"][None, :, None, None]


def group_norm(x: jax.Array, p: dict[str, jax.Array], groups: int) -> jax.Array:
    n, c, h, w = x.shape
    g = x.reshape(n, groups, c // groups, h, w)
    mean = g.mean(axis=(2, 3, 4), keepdims=True)
    var = jnp.square(g - mean).mean(axis=(2, 3, 4), keepdims=True)
    g = (g - mean) * jax.lax.rsqrt(var + GROUP_NORM_EPS)
    return g.reshape(n, c, h, w) * p["weight"][None, :, None, None] + p["bias"][None, :, None, None]


def max_pool2(x: jax.Array) -> jax.Array:
    return jax.lax.reduce_window(x, -jnp.inf, jax.lax.max, (1, 1, 2, 2), (1, 1, 2, 2), "VALID")


class ConvNet:
    """(N, 1, 16, 16) -> conv16 -> pool -> conv32 -> pool -> (N, 32*4*4) -> dropout -> n_classes."""

    def __init__(self, n_classes: int = 8, width: int = 16, groups: int = 4, dropout: float = 0.2) -> None:
        self.n_classes, self.width, self.groups, self.dropout = n_classes, width, groups, dropout

    def init(self, key: jax.Array, x: jax.Array, train: bool = False) -> dict[str, Any]:
        c_in, w = x.shape[1], self.width
        k = jax.random.split(key, 6)
        feat = 2 * w * (x.shape[2] // 4) * (x.shape[3] // 4)
        params = {
            "conv1": {"weight": _uniform(k[0], (w, c_in, 3, 3), c_in * 9), "bias": _uniform(k[1], (w,), c_in * 9)},
            "norm1": {"weight": jnp.ones((w,)), "bias": jnp.zeros((w,))},
            "conv2": {"weight": _uniform(k[2], (2 * w, w, 3, 3), w * 9), "bias": _uniform(k[3], (2 * w,), w * 9)},
            "norm2": {"weight": jnp.ones((2 * w,)), "bias": jnp.zeros((2 * w,))},
            "head": {"weight": _uniform(k[4], (self.n_classes, feat), feat), "bias": _uniform(k[5], (self.n_classes,), feat)},
        }
        return {"params": params}

    def apply(self, variables: dict[str, Any], x: jax.Array, train: bool = False,
              rngs: dict[str, jax.Array] | None = None) -> jax.Array:
        p = variables["params"]
        x = max_pool2(jax.nn.relu(group_norm(conv3x3(x, p["conv1"]), p["norm1"], self.groups)))
        x = max_pool2(jax.nn.relu(group_norm(conv3x3(x, p["conv2"]), p["norm2"], self.groups)))
        x = x.reshape(x.shape[0], -1)  # C, H, W order, as torch's flatten(1)
        if train and self.dropout > 0.0:
            keep = jax.random.bernoulli(rngs["dropout"], 1.0 - self.dropout, x.shape)
            x = jnp.where(keep, x / (1.0 - self.dropout), 0.0)
        return x @ p["head"]["weight"].T + p["head"]["bias"]
