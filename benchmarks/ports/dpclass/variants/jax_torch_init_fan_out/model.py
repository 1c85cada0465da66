"""The classifier in Flax (linen): the same ConvNet as the PyTorch reference's model.py.

Parity with torch.nn: NHWC layout (inputs are transposed once, at load time); Conv and Dense
are initialised like torch's Conv2d / Linear (weights and biases ~ U(-1/sqrt(fan_in),
1/sqrt(fan_in)), the kernels' fan_in computed from their shape by torch's own rule); GroupNorm uses torch's eps 1e-5 (flax's default is 1e-6) with scale 1 and
bias 0; dropout 0.2 before the head. The flatten order is NHWC's, not NCHW's: a permutation of
the head's 512 inputs, which an i.i.d. init does not see.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

GROUP_NORM_EPS = 1e-5  # torch.nn.GroupNorm default


def torch_bias_init(fan_in: int) -> nn.initializers.Initializer:
    """torch's bias init: U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with the weight's fan_in."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


def _calculate_fan_in(shape: tuple[int, ...]) -> int:
    """torch.nn.init._calculate_fan_in_and_fan_out's fan_in: size(1) * receptive field size."""
    receptive_field = math.prod(shape[2:]) if len(shape) > 2 else 1
    return shape[1] * receptive_field


def torch_kernel_init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
    """torch's Conv2d / Linear weight init, kaiming_uniform_(a=sqrt(5)): U(-1/sqrt(fan_in), 1/sqrt(fan_in)),
    fan_in read from the weight's shape as torch reads it."""
    bound = 1.0 / math.sqrt(_calculate_fan_in(shape))
    return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)


class ConvNet(nn.Module):
    """(N, 16, 16, 1) -> conv16 -> pool -> conv32 -> pool -> (N, 512) -> dropout -> n_classes."""

    n_classes: int = 8
    width: int = 16
    groups: int = 4
    dropout: float = 0.2

    def _conv(self, features: int, in_features: int, name: str) -> nn.Conv:
        bias_init = torch_bias_init(in_features * 3 * 3)
        return nn.Conv(features, (3, 3), padding=1, kernel_init=torch_kernel_init, bias_init=bias_init, name=name)

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
        bias_init = torch_bias_init(x.shape[-1])
        return nn.Dense(self.n_classes, kernel_init=torch_kernel_init, bias_init=bias_init, name="head")(x)
