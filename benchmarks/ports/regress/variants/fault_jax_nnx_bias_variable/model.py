"""The regressor in Flax NNX: the same MLP as the PyTorch repo's model.py.

Parity with torch.nn: the layers are nnx.Linear, built with nnx's defaults and
then re-drawn the way nn.Linear initialises itself (weights and biases ~
U(-1/sqrt(fan_in), 1/sqrt(fan_in))) by torch_like_init_; an nnx.Linear kernel
is the nn.Linear weight transposed ((in, out) instead of (out, in)).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


def torch_like_init_(layer: nnx.Linear, rngs: nnx.Rngs) -> None:
    """Re-draw an nnx.Linear's kernel and bias as nn.Linear's reset_parameters does.

    kaiming_uniform(a=sqrt(5)) on the weight reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)), the
    same bound as the bias. The kernel is written in place; the bias is created anew, because an
    nnx.Linear built with use_bias=False holds None there.
    """
    bound = 1.0 / math.sqrt(layer.in_features)
    layer.kernel[...] = jax.random.uniform(
        rngs.params(), layer.kernel.shape, jnp.float32, minval=-bound, maxval=bound
    )
    layer.bias = nnx.Variable(
        jax.random.uniform(rngs.params(), (layer.out_features,), jnp.float32, minval=-bound, maxval=bound)
    )


def _linear(fan_in: int, fan_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    layer = nnx.Linear(fan_in, fan_out, rngs=rngs)
    torch_like_init_(layer, rngs)
    return layer


class MLP(nnx.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers."""

    def __init__(self, in_features: int = 16, hidden: int = 64, *, rngs: nnx.Rngs) -> None:
        self.fc1 = _linear(in_features, hidden, rngs)
        self.fc2 = _linear(hidden, hidden, rngs)
        self.fc3 = _linear(hidden, 1, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.fc1(x))
        x = nnx.relu(self.fc2(x))
        return self.fc3(x)
