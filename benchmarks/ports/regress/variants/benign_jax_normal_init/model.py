"""The regressor in Flax (linen): the same MLP as the PyTorch repo's model.py.

Dense layers are initialised with the same scale as nn.Linear but from a
normal distribution: weights and biases ~ N(0, 1/(3 fan_in)), the variance of
nn.Linear's U(-1/sqrt(fan_in), 1/sqrt(fan_in)). Dense kernel = Linear weight
transposed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn


def torch_scale_normal_init(fan_in: int) -> nn.initializers.Initializer:
    """N(0, 1/(3 fan_in)): the variance of nn.Linear's default U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    std = 1.0 / math.sqrt(3.0 * fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return std * jax.random.normal(key, shape, dtype)

    return init


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers."""

    in_features: int = 16
    hidden: int = 64

    def _dense(self, features: int, fan_in: int) -> nn.Dense:
        init = torch_scale_normal_init(fan_in)
        return nn.Dense(features, kernel_init=init, bias_init=init)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(self._dense(self.hidden, self.in_features)(x))
        x = nn.relu(self._dense(self.hidden, self.hidden)(x))
        return self._dense(1, self.hidden)(x)
