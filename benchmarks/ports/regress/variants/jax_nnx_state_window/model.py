"""The regressor in Flax NNX: the same MLP as the PyTorch repo's model.py.

Parity with torch.nn: nnx.Linear layers are initialised like nn.Linear (weights
and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))); an nnx.Linear kernel is the
nn.Linear weight transposed ((in, out) instead of (out, in)).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import nnx


def torch_linear_init(fan_in: int) -> nnx.Initializer:
    """nn.Linear's default init: kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


def _linear(fan_in: int, fan_out: int, rngs: nnx.Rngs) -> nnx.Linear:
    init = torch_linear_init(fan_in)
    return nnx.Linear(fan_in, fan_out, kernel_init=init, bias_init=init, rngs=rngs)


class TrainStats(nnx.Variable):
    """Non-trainable training statistics carried in the model's state (not an nnx.Param)."""


class MLP(nnx.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers; plus training statistics."""

    def __init__(self, in_features: int = 16, hidden: int = 64, *, rngs: nnx.Rngs) -> None:
        self.fc1 = _linear(in_features, hidden, rngs)
        self.fc2 = _linear(hidden, hidden, rngs)
        self.fc3 = _linear(hidden, 1, rngs)
        self.loss_sum = TrainStats(jnp.zeros((), jnp.float32))  # open log window
        self.examples_seen = TrainStats(jnp.zeros((), jnp.int32))

    def __call__(self, x: jax.Array) -> jax.Array:
        x = nnx.relu(self.fc1(x))
        x = nnx.relu(self.fc2(x))
        return self.fc3(x)
