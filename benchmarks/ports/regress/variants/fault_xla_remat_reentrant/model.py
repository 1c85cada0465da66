"""The regressor: a two-hidden-layer ReLU MLP with one output (PyTorch/XLA port).

The same layers, names and init as the PyTorch repo's model.py (net.0, net.2,
net.4; PyTorch's default nn.Linear init). Port addition: in training mode each
hidden block (Linear + ReLU) runs under torch_xla's gradient checkpointing
(torch_xla.utils.checkpoint.checkpoint, which puts an optimization barrier in
front of the recomputation so XLA's CSE cannot undo it): the block's
activations are recomputed in the backward pass instead of being kept in
device memory. Evaluation (model.eval()) runs the blocks directly.
"""

from __future__ import annotations

import torch
from torch import nn
from torch_xla.utils.checkpoint import checkpoint

HIDDEN_BLOCKS = (slice(0, 2), slice(2, 4))  # net.0 + ReLU, net.2 + ReLU; net.4 is the head


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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for block in HIDDEN_BLOCKS:
            layers = self.net[block]
            h = checkpoint(layers, h) if self.training else layers(h)  # rematerialised in training
        return self.net[4](h)
