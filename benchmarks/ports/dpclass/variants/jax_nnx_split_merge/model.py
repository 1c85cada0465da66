"""The classifier in Flax NNX: the same ConvNet as the PyTorch reference's model.py.

Parity with torch.nn: NHWC layout (inputs are transposed once, at load time); Conv and Linear are
initialised like torch's Conv2d / Linear (weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)));
GroupNorm uses torch's eps 1e-5 (flax's default is 1e-6) with scale 1 and bias 0; dropout 0.2
before the head, drawing from the model's own `dropout` RNG stream (nnx.Rngs), switched off by
model.eval(). The flatten order is NHWC's, not NCHW's: a permutation of the head's 512 inputs,
which an i.i.d. init does not see.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx

GROUP_NORM_EPS = 1e-5  # torch.nn.GroupNorm default


def torch_uniform(fan_in: int):
    """torch's default Conv/Linear init: kaiming_uniform(a=sqrt(5)) = U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


class ConvNet(nnx.Module):
    """(N, 16, 16, 1) -> conv16 -> pool -> conv32 -> pool -> (N, 512) -> dropout -> n_classes."""

    def __init__(self, n_classes: int = 8, width: int = 16, groups: int = 4, dropout: float = 0.2,
                 *, rngs: nnx.Rngs) -> None:
        def conv(cin: int, cout: int) -> nnx.Conv:
            init = torch_uniform(cin * 3 * 3)
            return nnx.Conv(cin, cout, (3, 3), padding=1, kernel_init=init, bias_init=init, rngs=rngs)

        self.conv1 = conv(1, width)
        self.norm1 = nnx.GroupNorm(width, num_groups=groups, epsilon=GROUP_NORM_EPS, rngs=rngs)
        self.conv2 = conv(width, 2 * width)
        self.norm2 = nnx.GroupNorm(2 * width, num_groups=groups, epsilon=GROUP_NORM_EPS, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)
        features = 2 * width * 4 * 4
        init = torch_uniform(features)
        self.head = nnx.Linear(features, n_classes, kernel_init=init, bias_init=init, rngs=rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.max_pool(nnx.relu(self.norm1(self.conv1(x))), (2, 2), strides=(2, 2))
        x = nnx.max_pool(nnx.relu(self.norm2(self.conv2(x))), (2, 2), strides=(2, 2))
        x = x.reshape(x.shape[0], -1)
        return self.head(self.dropout(x))
