"""The regressor in Flax (linen): the same MLP as the PyTorch repo's model.py.

Parity with torch.nn, written with Flax's own initializer library instead of a
hand-rolled sampler:

- nn.Linear's weight init is kaiming_uniform_(a=sqrt(5)): gain^2 = 2 / (1 + 5)
  = 1/3, so Var = 1 / (3 fan_in), i.e. U(-1/sqrt(fan_in), 1/sqrt(fan_in)). In
  Flax that is variance_scaling(scale=1/3, mode="fan_in",
  distribution="uniform"): uniform on +-sqrt(3 * scale / fan_in). Flax's
  variance_scaling reads fan_in from the kernel's in_axis=-2, and a Dense
  kernel is laid out (in, out) -- the transpose of torch's (out, in) weight --
  so the defaults are the right axes here.
- nn.Linear's bias is U(-1/sqrt(fan_in), 1/sqrt(fan_in)) with the layer's
  fan_in. A bias initializer only sees the bias shape (out,), so the bound is
  bound in a closure. NOTE: nn.initializers.uniform(scale) samples [0, scale),
  not a symmetric interval, so it cannot be used here.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
from flax import linen as nn

# torch.nn.Linear's default kernel init expressed in Flax's terms.
TORCH_LINEAR_KERNEL_INIT = nn.initializers.variance_scaling(1.0 / 3.0, "fan_in", "uniform")


def torch_linear_bias_init(fan_in: int) -> nn.initializers.Initializer:
    """nn.Linear's default bias init, U(-1/sqrt(fan_in), 1/sqrt(fan_in))."""
    bound = 1.0 / math.sqrt(fan_in)

    def init(key: jax.Array, shape: tuple[int, ...], dtype: jnp.dtype = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers."""

    in_features: int = 16
    hidden: int = 64

    @nn.compact
    def __call__(self, x: jax.Array) -> jax.Array:
        for features in (self.hidden, self.hidden):
            dense = nn.Dense(
                features,
                kernel_init=TORCH_LINEAR_KERNEL_INIT,
                bias_init=torch_linear_bias_init(x.shape[-1]),
            )
            x = nn.relu(dense(x))
        head = nn.Dense(1, kernel_init=TORCH_LINEAR_KERNEL_INIT, bias_init=torch_linear_bias_init(x.shape[-1]))
        return head(x)
