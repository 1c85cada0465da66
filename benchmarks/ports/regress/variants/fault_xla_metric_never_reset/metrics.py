"""A device-resident metric in the torchmetrics style (update / compute / reset).

The state (sum of squared errors, number of items) lives on the metric's device,
so an evaluation adds to it without a host read per batch; compute() returns a
device scalar and the caller reads it once.
"""

from __future__ import annotations

from typing import Any

import torch


class MeanSquaredError:
    """Running mean squared error over every item passed to update() since the last reset()."""

    def __init__(self, device: Any) -> None:
        self.device = device
        self.sum_squared_error = torch.zeros((), device=device)
        self.total = torch.zeros((), dtype=torch.int64, device=device)

    @torch.no_grad()
    def update(self, preds: torch.Tensor, target: torch.Tensor) -> None:
        self.sum_squared_error += torch.sum((preds - target) ** 2)
        self.total += target.numel()

    def compute(self) -> torch.Tensor:
        return self.sum_squared_error / self.total

    def reset(self) -> None:
        self.sum_squared_error.zero_()
        self.total.zero_()
