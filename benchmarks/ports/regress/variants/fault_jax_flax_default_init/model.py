"""The regressor in Flax (linen): the same MLP as the PyTorch repo's model.py.

Flax's default initialisers are kept (kernels lecun_normal, i.e. truncated
normal with variance 1/fan_in; biases zero) instead of reproducing
nn.Linear's uniform init; the architecture is the same. Dense kernel = Linear
weight transposed.
"""

from __future__ import annotations

import jax
from flax import linen as nn


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers."""

    in_features: int = 16
    hidden: int = 64

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        x = nn.relu(nn.Dense(self.hidden)(x))
        x = nn.relu(nn.Dense(self.hidden)(x))
        return nn.Dense(1)(x)
