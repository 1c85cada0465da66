"""The classifier in Flax (linen): the same ConvNet as the PyTorch reference's model.py.

Parity with torch.nn: NHWC layout (inputs are transposed once, at load time); the layers are the
library's own nn.Conv(3x3, padding 1) and nn.Dense with their built-in initialisers; GroupNorm uses
torch's eps 1e-5 (flax's default is 1e-6) with scale 1 and bias 0; dropout 0.2 before the head. The
flatten order is NHWC's, not NCHW's: a permutation of the head's 512 inputs.
"""

from __future__ import annotations

import jax
from flax import linen as nn

GROUP_NORM_EPS = 1e-5  # torch.nn.GroupNorm default


class ConvNet(nn.Module):
    """(N, 16, 16, 1) -> conv16 -> pool -> conv32 -> pool -> (N, 512) -> dropout -> n_classes."""

    n_classes: int = 8
    width: int = 16
    groups: int = 4
    dropout: float = 0.2

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        x = nn.Conv(self.width, (3, 3), padding=1, name="conv1")(x)
        x = nn.GroupNorm(num_groups=self.groups, epsilon=GROUP_NORM_EPS, name="norm1")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = nn.Conv(2 * self.width, (3, 3), padding=1, name="conv2")(x)
        x = nn.GroupNorm(num_groups=self.groups, epsilon=GROUP_NORM_EPS, name="norm2")(x)
        x = nn.max_pool(nn.relu(x), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        x = nn.Dropout(self.dropout, deterministic=not train)(x)
        return nn.Dense(self.n_classes, name="head")(x)
