"""The character MLP in Flax (linen), initialised as torch initialises it.

nn.Embedding draws N(0, 1); nn.Linear draws weights and biases from U(-1/sqrt(fan_in), 1/sqrt(fan_in)).
Submodules keep the torch names (wte, fc, head) so weights map back onto the reference's state dict.
"""

import math

import jax
import jax.numpy as jnp
from flax import linen as nn


def torch_linear_init(fan_in: int):
    bound = 1.0 / math.sqrt(fan_in)

    def init(key, shape, dtype=jnp.float32):
        return jax.random.uniform(key, shape, dtype, minval=-bound, maxval=bound)

    return init


class CharMLP(nn.Module):
    vocab_size: int
    block_size: int
    n_embd: int
    n_hidden: int

    @nn.compact
    def __call__(self, idx: jax.Array) -> jax.Array:
        x = nn.Embed(self.vocab_size, self.n_embd, embedding_init=nn.initializers.normal(1.0), name="wte")(idx)
        x = x.reshape(x.shape[0], -1)
        fan_in = self.block_size * self.n_embd
        x = jnp.tanh(nn.Dense(self.n_hidden, kernel_init=torch_linear_init(fan_in),
                              bias_init=torch_linear_init(fan_in), name="fc")(x))
        return nn.Dense(self.vocab_size, kernel_init=torch_linear_init(self.n_hidden),
                        bias_init=torch_linear_init(self.n_hidden), name="head")(x)
