"""The regressor: a two-hidden-layer ReLU MLP with one output, biases folded into the weights.

Each affine layer keeps ONE parameter, weight of shape (out, in + 1) = [W | b], and
computes [x, 1] @ weight.T (the "bias trick": one matmul per layer, one tensor per layer
for the optimiser and the checkpoint). The values are initialised by an nn.Linear of the
same shape, so the draws are nn.Linear's (weights and biases U(-1/sqrt(fan_in),
1/sqrt(fan_in)), in the same order from torch's generator). The output equals
x @ W.T + b; the gradient of [W | b] is [dW | db]; torch.optim.SGD decays, and keeps
momentum for, every element alike, so the training is the per-layer one re-laid out.
"""

from __future__ import annotations

import torch
from torch import nn


class AugmentedLinear(nn.Module):
    """y = [x, 1] @ weight.T with weight = [W | b] of shape (out_features, in_features + 1)."""

    def __init__(self, in_features: int, out_features: int) -> None:
        super().__init__()
        init = nn.Linear(in_features, out_features)  # nn.Linear's default init, drawn as the PyTorch repo draws it
        with torch.no_grad():
            fused = torch.cat([init.weight, init.bias.unsqueeze(1)], dim=1)
        self.weight = nn.Parameter(fused)
        self.in_features, self.out_features = in_features, out_features

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        ones = torch.ones(*x.shape[:-1], 1, dtype=x.dtype, device=x.device)
        return torch.cat([x, ones], dim=-1) @ self.weight.t()


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers; nn.Linear's init, biases folded in."""

    def __init__(self, in_features: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            AugmentedLinear(in_features, hidden),
            nn.ReLU(),
            AugmentedLinear(hidden, hidden),
            nn.ReLU(),
            AugmentedLinear(hidden, 1),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)
