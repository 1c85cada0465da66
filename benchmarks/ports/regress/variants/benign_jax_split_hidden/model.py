"""The regressor in Flax (linen): the same MLP as the PyTorch repo's model.py, hidden layers split.

Each hidden layer (hidden units) is laid out as SHARDS column blocks, Dense(hidden //
SHARDS) each, applied to the same input and concatenated (the column-parallel layout of
tensor-parallel code, so that a layer's blocks can be placed on different devices). A
block's units see the layer's whole input, so fan_in, and nn.Linear's init bound, are the
layer's: every weight and bias ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)), as in torch. The
concatenation is the unsplit layer's output, and SGD's decay and momentum act element by
element, so this is the per-layer model re-laid out (its own draw of the init).
Parameters: Dense_0_0, Dense_0_1 (first hidden layer), Dense_1_0, Dense_1_1 (second),
Dense_2 (output); Dense kernel = Linear weight block transposed.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

SHARDS = 2


def torch_linear_init(fan_in: int) -> nn.initializers.Initializer:
    """nn.Linear's default init: kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers; hidden layers in SHARDS column blocks."""

    in_features: int = 16
    hidden: int = 64

    def _dense(self, features: int, fan_in: int, name: str) -> nn.Dense:
        init = torch_linear_init(fan_in)
        return nn.Dense(features, kernel_init=init, bias_init=init, name=name)

    def _split(self, x: jax.Array, fan_in: int, layer: int) -> jax.Array:
        if self.hidden % SHARDS:
            raise ValueError(f"hidden={self.hidden} is not divisible by {SHARDS} blocks")
        width = self.hidden // SHARDS
        blocks = [self._dense(width, fan_in, f"Dense_{layer}_{i}")(x) for i in range(SHARDS)]
        return jnp.concatenate(blocks, axis=-1)

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(self._split(x, self.in_features, 0))
        x = nn.relu(self._split(x, self.hidden, 1))
        return self._dense(1, self.hidden, "Dense_2")(x)
