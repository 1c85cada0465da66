"""The regressor: a two-hidden-layer ReLU MLP with one output."""

from __future__ import annotations

import torch
from torch import nn


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers; PyTorch's default nn.Linear init."""

    def __init__(self, in_features: int = 16, hidden: int = 64) -> None:
        super().__init__()
        self.net = nn.Sequential(
            nn.Linear(in_features, hidden),
            nn.ReLU(),
            nn.Linear(hidden, hidden),
            nn.ReLU(),
            nn.Linear(hidden, 1),
        )

    def forward(self, *groups: torch.Tensor) -> torch.Tensor:
        """The feature groups, concatenated along the feature axis in the order given (one group: as is)."""
        x = groups[0] if len(groups) == 1 else torch.cat(groups, dim=1)
        return self.net(x)
