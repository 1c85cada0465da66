"""The regressor in Flax (linen): the same MLP as the PyTorch repo's model.py.

Parity with torch.nn: Dense layers are initialised like nn.Linear (weights and
biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))); Dense kernel = Linear weight
transposed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn


def torch_linear_init(fan_in: int) -> nn.initializers.Initializer:
    """nn.Linear's default init: kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers."""

    in_features: int = 16
    hidden: int = 64

    def _dense(self, features: int, fan_in: int) -> nn.Dense:
        init = torch_linear_init(fan_in)
        return nn.Dense(features, kernel_init=init, bias_init=init)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(self._dense(self.hidden, self.in_features)(x))
        x = nn.relu(self._dense(self.hidden, self.hidden)(x))
        return self._dense(1, self.hidden)(x)
