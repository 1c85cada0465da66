"""The classifier in Flax (linen): the same ConvNet as the PyTorch reference's model.py.

Parity with torch.nn: NHWC layout (inputs are transposed once, at load time); Conv and Dense
are initialised like torch's Conv2d / Linear (weights and biases ~ U(-1/sqrt(fan_in),
1/sqrt(fan_in))); GroupNorm is written out as torch.nn.GroupNorm computes it (TorchGroupNorm:
per sample and group, mean and biased variance over H, W and the group's channels, eps 1e-5,
then a per-channel scale 1 and bias 0), not flax.linen.GroupNorm; the group statistics are
treated as per-sample constants of the normalisation (jax.lax.stop_gradient, as the batch
statistics of a normalisation layer are held out of the backward pass, which also spares XLA the
backward of the two reductions); dropout 0.2 before the head.
The flatten order is NHWC's, not NCHW's: a permutation of the head's 512 inputs, which an
i.i.d. init does not see.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

GROUP_NORM_EPS = 1e-5  # torch.nn.GroupNorm default


def torch_uniform(fan_in: int) -> nn.initializers.Initializer:
    """torch's default Conv/Linear init: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


class TorchGroupNorm(nn.Module):
    """torch.nn.GroupNorm(num_groups, C) on NHWC input: statistics per sample over (H, W, C / num_groups)."""

    num_groups: int
    epsilon: float = GROUP_NORM_EPS

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        n, h, w, c = x.shape
        scale = self.param("scale", nn.initializers.ones, (c,))
        bias = self.param("bias", nn.initializers.zeros, (c,))
        g = x.reshape(n, h, w, self.num_groups, c // self.num_groups)
        # statistics of the sample: constants for the backward pass, only the normalised values carry gradient
        mean = jax.lax.stop_gradient(g.mean(axis=(1, 2, 4), keepdims=True))
        var = jax.lax.stop_gradient(jnp.square(g - mean).mean(axis=(1, 2, 4), keepdims=True))
        g = (g - mean) * jax.lax.rsqrt(var + self.epsilon)
        return g.reshape(n, h, w, c) * scale + bias


class ConvNet(nn.Module):
    """(N, 16, 16, 1) -> conv16 -> pool -> conv32 -> pool -> (N, 512) -> dropout -> n_classes."""

    n_classes: int = 8
    width: int = 16
    groups: int = 4
    dropout: float = 0.2

    def _conv(self, features: int, in_features: int, name: str) -> nn.Conv:
        init = torch_uniform(in_features * 3 * 3)
        return nn.Conv(features, (3, 3), padding=1, kernel_init=init, bias_init=init, name=name)

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = self._conv(self.width, x.shape[-1], "conv1")(x)
        x = TorchGroupNorm(self.groups, name="norm1")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = self._conv(2 * self.width, self.width, "conv2")(x)
        x = TorchGroupNorm(self.groups, name="norm2")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        init = torch_uniform(x.shape[-1])
        return nn.Dense(self.n_classes, kernel_init=init, bias_init=init, name="head")(x)
