"""The classifier in Flax (linen): the same MLP as the PyTorch repo's model.py.

Parity with torch.nn: Dense layers are initialised like nn.Linear (weights and
biases ~ U(-1/sqrt(fan_in), 1/sqrt(fan_in))), LayerNorm uses torch's eps 1e-5
and the two-pass variance, and submodules keep the torch names (fc1, norm1,
fc2, norm2, head) so weights map back onto the PyTorch state dict
(Dense kernel = Linear weight transposed; LayerNorm scale = weight).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

import jax
import jax.numpy as jnp
import numpy as np
from flax import linen as nn

LAYER_NORM_EPS = 1e-5  # torch.nn.LayerNorm default; flax's default is 1e-6
# flax leaf -> (torch parameter name, transposed): Dense kernels are (in, out), Linear weights (out, in)
TORCH_NAMES = {"kernel": ("weight", True), "bias": ("bias", False), "scale": ("weight", False)}


def torch_linear_init(fan_in: int) -> nn.initializers.Initializer:
    """nn.Linear's default init: kaiming_uniform(a=sqrt(5)) reduces to U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> n_classes; Dense, LayerNorm, ReLU, Dropout per block."""

    in_features: int = 32
    hidden: int = 128
    n_classes: int = 8
    dropout: float = 0.1

    def _dense(self, features: int, fan_in: int, name: str) -> nn.Dense:
        init = torch_linear_init(fan_in)
        return nn.Dense(features, kernel_init=init, bias_init=init, name=name)

    def _norm(self, name: str) -> nn.LayerNorm:
        return nn.LayerNorm(epsilon=LAYER_NORM_EPS, use_fast_variance=False, name=name)

    @nn.compact
    def __call__(self, x: jax.Array, train: bool) -> jax.Array:
        drop = nn.Dropout(self.dropout, deterministic=not train)
        x = drop(nn.relu(self._norm("norm1")(self._dense(self.hidden, self.in_features, "fc1")(x))))
        x = drop(nn.relu(self._norm("norm2")(self._dense(self.hidden, self.hidden, "fc2")(x))))
        return self._dense(self.n_classes, self.hidden, "head")(x)


def to_torch_names(params: dict) -> dict[str, np.ndarray]:
    """Flax parameters as the PyTorch repo's state dict: `fc1.weight` is fc1's kernel transposed."""
    out: dict[str, np.ndarray] = {}
    for layer, leaves in params.items():
        for leaf, value in leaves.items():
            name, transpose = TORCH_NAMES[leaf]
            array = np.asarray(value)
            out[f"{layer}.{name}"] = array.T if transpose else array
    return out


def from_torch_names(weights: Mapping[str, np.ndarray], like: dict) -> tuple[dict, list[dict]]:
    """The PyTorch repo's named weights as flax parameters shaped like `like`, and the transplant made
    (each target leaf, its source name, transposed or not)."""
    params: dict = {}
    transplant: list[dict] = []
    for layer, leaves in like.items():
        params[layer] = {}
        for leaf in leaves:
            name, transpose = TORCH_NAMES[leaf]
            source = f"{layer}.{name}"
            array = np.asarray(weights[source])
            params[layer][leaf] = jnp.asarray(array.T if transpose else array)
            transplant.append({"target": f"{layer}/{leaf}", "source": source, "transpose": transpose})
    return params, transplant
