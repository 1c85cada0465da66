"""The classifier: two 3x3 conv blocks (Conv -> GroupNorm -> ReLU -> 2x2 max-pool), dropout, a linear head.

GroupNorm, not BatchNorm: it normalises each sample on its own, so data-parallel replicas need
no synchronised batch statistics (no SyncBatchNorm question) and the model has no buffers.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.nn import functional as F


class ConvNet(nn.Module):
    """(N, 1, 16, 16) -> conv16 -> pool -> conv32 -> pool -> (N, 32*4*4) -> dropout -> n_classes."""

    def __init__(self, n_classes: int = 8, width: int = 16, groups: int = 4, dropout: float = 0.2) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, width, 3, padding=1)
        self.norm1 = nn.GroupNorm(groups, width)
        self.conv2 = nn.Conv2d(width, 2 * width, 3, padding=1)
        self.norm2 = nn.GroupNorm(groups, 2 * width)
        self.dropout = nn.Dropout(dropout)
        self.head = nn.Linear(2 * width * 4 * 4, n_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.max_pool2d(F.relu(self.norm1(self.conv1(x))), 2)
        x = F.max_pool2d(F.relu(self.norm2(self.conv2(x))), 2)
        return self.head(self.dropout(x.flatten(1)))
