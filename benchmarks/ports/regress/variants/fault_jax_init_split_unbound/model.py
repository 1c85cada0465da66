"""The regressor in plain JAX: the same MLP as the PyTorch repo's model.py, no Flax.

The parameters are a flat dict named and laid out exactly like the PyTorch
model's state_dict ("net.0.weight" of shape (out, in), "net.0.bias", ...), so a
checkpoint converts by name with no transposes; the forward pass is
x @ W.T + b, as nn.Linear computes it. Init is nn.Linear's default:
weights and biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in)).

Randomness: the init key is split into a weight key and a bias key for each
layer, as in the JAX tutorials' MLP init.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

Params = dict[str, jax.Array]


def layer_sizes(in_features: int = 16, hidden: int = 64) -> list[tuple[int, int]]:
    """(fan_in, fan_out) of the three Linear layers: net.0, net.2, net.4 in torch's Sequential."""
    return [(in_features, hidden), (hidden, hidden), (hidden, 1)]


def init_mlp(key: jax.Array, in_features: int = 16, hidden: int = 64) -> Params:
    """nn.Linear's default init for every layer, torch names and (out, in) weight layout."""
    params: Params = {}
    for i, (fan_in, fan_out) in enumerate(layer_sizes(in_features, hidden)):
        w_key, b_key = jax.random.split(key)
        bound = 1.0 / math.sqrt(fan_in)
        params[f"net.{2 * i}.weight"] = jax.random.uniform(
            w_key, (fan_out, fan_in), jnp.float32, minval=-bound, maxval=bound
        )
        params[f"net.{2 * i}.bias"] = jax.random.uniform(
            b_key, (fan_out,), jnp.float32, minval=-bound, maxval=bound
        )
    return params


def mlp_apply(params: Params, x: jax.Array) -> jax.Array:
    """in -> hidden -> hidden -> 1 with ReLU between layers; returns shape (batch, 1)."""
    h = jax.nn.relu(x @ params["net.0.weight"].T + params["net.0.bias"])
    h = jax.nn.relu(h @ params["net.2.weight"].T + params["net.2.bias"])
    return h @ params["net.4.weight"].T + params["net.4.bias"]
