"""The regressor: a two-hidden-layer ReLU MLP with one output.

Port notes (PyTorch/XLA): the layers are a small Dense module that stores its
weight as (in_features, out_features) and computes x @ W + b: the layout the
XLA dot takes without a transpose in the graph, and the one the JAX/Flax
checkpoints of this model use (Dense kernel), so weights convert between the
two ports without transposes. Its reset_parameters is nn.Linear's own, kept
verbatim so the init matches the PyTorch repo's.
"""

from __future__ import annotations

import math

import torch
from torch import nn


class Dense(nn.Module):
    """y = x @ weight + bias, weight of shape (in_features, out_features)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        self.in_features = in_features
        self.out_features = out_features
        self.weight = nn.Parameter(torch.empty(in_features, out_features))
        self.bias = nn.Parameter(torch.empty(out_features))
        self.reset_parameters()

    def reset_parameters(self) -> None:
        # nn.Linear.reset_parameters, unchanged.
        nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        fan_in, _ = nn.init._calculate_fan_in_and_fan_out(self.weight)
        bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
        nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x @ self.weight + self.bias


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers."""

    def __init__(self, in_features: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            Dense(in_features, hidden),
            nn.ReLU(),
            Dense(hidden, hidden),
            nn.ReLU(),
            Dense(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
