"""The regressor: a two-hidden-layer ReLU MLP with one output.

Port note: the layers are written the way the JAX port writes them, by their
output width only (nn.LazyLinear: in_features inferred from the first input,
like flax's nn.Dense(features)). The model runs one dry forward pass on a
host zero batch inside __init__, before it is moved to the device, so every
parameter is materialised on the host and the optimizer later sees ordinary
nn.Parameters. Materialisation calls nn.Linear.reset_parameters, layer by
layer in forward order: the same kaiming_uniform_(a=sqrt(5)) weight and
U(-1/sqrt(fan_in), 1/sqrt(fan_in)) bias draws as nn.Linear(in, out), from
the same (seeded) torch generator, in the same order. A zero-element
LazyLinear placeholder draws nothing.
"""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers; nn.Linear's default init (via LazyLinear)."""

    def __init__(self, in_features: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.LazyLinear(hidden),
            nn.ReLU(),
            nn.LazyLinear(hidden),
            nn.ReLU(),
            nn.LazyLinear(1),
        )
        # Shape inference on the host: materialises (and initialises) every layer now.
        with torch.no_grad():
            self.net(torch.zeros(1, in_features))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
