"""The regressor with jax.example_libraries.stax: the same MLP as the PyTorch repo's model.py.

Parameters are stax's list of per-layer tuples: [(W0, b0), (), (W1, b1), (), (W2, b2)] (Relu layers
have no parameters); W is (in, out), i.e. nn.Linear's weight transposed. Every Dense layer is
initialised like nn.Linear: weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from jax.example_libraries import stax


def torch_uniform(fan_in: int):
    """nn.Linear's default init (kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in)))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype=jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


def linear(fan_in: int, fan_out: int):
    """stax.Dense with nn.Linear's init (stax only passes the shape, so fan_in is bound here)."""
    init = torch_uniform(fan_in)
    return stax.Dense(fan_out, W_init=init, b_init=init)


def mlp(in_features: int = 16, hidden: int = 64):
    """in_features -> hidden -> hidden -> 1, ReLU between layers: (init_fun, apply_fun)."""
    return stax.serial(
        linear(in_features, hidden),
        stax.Relu,
        linear(hidden, hidden),
        stax.Relu,
        linear(hidden, 1),
    )
