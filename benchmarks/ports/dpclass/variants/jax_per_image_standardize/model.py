"""The classifier in Flax (linen): the same ConvNet as the PyTorch reference's model.py.

Parity with torch.nn: NHWC layout (inputs are transposed once, at load time); Conv and Dense
are initialised like torch's Conv2d / Linear (weights and biases ~ U(-1/sqrt(fan_in),
1/sqrt(fan_in))); GroupNorm uses torch's eps 1e-5 (flax's default is 1e-6) with scale 1 and
bias 0; dropout 0.2 before the head. The flatten order is NHWC's, not NCHW's: a permutation of
the head's 512 inputs, which an i.i.d. init does not see.
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
        x = nn.GroupNorm(num_groups=self.groups, epsilon=GROUP_NORM_EPS, name="norm1")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = self._conv(2 * self.width, self.width, "conv2")(x)
        x = nn.GroupNorm(num_groups=self.groups, epsilon=GROUP_NORM_EPS, name="norm2")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        init = torch_uniform(x.shape[-1])
        return nn.Dense(self.n_classes, kernel_init=init, bias_init=init, name="head")(x)
