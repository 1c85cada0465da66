"""The classifier: a two-hidden-layer MLP with LayerNorm and dropout."""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> n_classes; Linear, LayerNorm, ReLU, Dropout per block."""

    def __init__(
        self, in_features: int = 32, hidden: int = 128, n_classes: int = 8, dropout: float = 0.1
    ) -> None:
        super().__init__()
        self.fc1 = nn.Linear(in_features, hidden)
        self.norm1 = nn.LayerNorm(hidden)
        self.fc2 = nn.Linear(hidden, hidden)
        self.norm2 = nn.LayerNorm(hidden)
        self.head = nn.Linear(hidden, n_classes)
        self.dropout = nn.Dropout(dropout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.dropout(F.relu(self.norm1(self.fc1(x))))
        x = self.dropout(F.relu(self.norm2(self.fc2(x))))
        return self.head(x)
