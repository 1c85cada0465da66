"""Metrics the clu.metrics way: immutable (total, count) pytrees merged on the device.

An Average holds a sum and an item count. A jitted function returns one per
batch, the host merges them with `+` (device arrays, nothing is read back), and
compute() divides once, when a value is printed. Every item weighs the same,
whatever batch it came in.
"""

from __future__ import annotations

import jax.numpy as jnp
from flax import struct


@struct.dataclass
class Average:
    total: jnp.ndarray
    count: jnp.ndarray

    @classmethod
    def empty(cls) -> "Average":
        return cls(total=jnp.zeros((), jnp.float32), count=jnp.zeros((), jnp.int32))

    @classmethod
    def from_values(cls, values: jnp.ndarray) -> "Average":
        """The average of `values` (one per item)."""
        return cls(total=jnp.sum(values), count=jnp.asarray(values.size, jnp.int32))

    def merge(self, other: "Average") -> "Average":
        return type(self)(total=self.total + other.total, count=self.count + other.count)

    def compute(self) -> float:
        """Read back (one transfer) and divide."""
        total, count = float(self.total), int(self.count)
        return total / count
