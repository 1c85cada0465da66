"""The regressor: a two-hidden-layer ReLU MLP with one output, all parameters in ONE flat tensor.

The FSDP / ZeRO "flat parameter" layout: the three layers' weights and biases live in a
single 1-d nn.Parameter `flat` (5313 elements), in the order net.0.weight, net.0.bias,
net.2.weight, net.2.bias, net.4.weight, net.4.bias, each row-major as in torch's
(out, in) weight. The forward reads each layer's weight and bias as views of `flat`
(slice + view, no copy), so one optimizer tensor, one gradient buffer and one
checkpoint entry hold the whole model. The values are initialised by nn.Linear layers
of the same shapes (the reference's draws, in the same order from torch's generator).
torch.optim.SGD's coupled decay and momentum act elementwise, so training the flat
tensor is the per-layer training re-laid out.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class MLP(nn.Module):
    """in_features -> hidden -> hidden -> 1, ReLU between layers; nn.Linear's init, one flat parameter."""

    def __init__(self, in_features: int = 16, hidden: int = 64) -> None:
        super().__init__()
        layers = [nn.Linear(in_features, hidden), nn.Linear(hidden, hidden), nn.Linear(hidden, 1)]
        # (name in the PyTorch repo's state_dict, shape, offset into flat)
        self.layout: list[tuple[str, tuple[int, ...], int]] = []
        offset = 0
        for index, layer in zip((0, 2, 4), layers):
            for kind, p in (("weight", layer.weight), ("bias", layer.bias)):
                self.layout.append((f"net.{index}.{kind}", tuple(p.shape), offset))
                offset += p.numel()
        with torch.no_grad():
            flat = torch.cat([p.reshape(-1) for layer in layers for p in (layer.weight, layer.bias)])
        self.flat = nn.Parameter(flat)

    def views(self) -> dict[str, torch.Tensor]:
        """Each layer tensor as a view of the flat parameter (gradients flow into flat)."""
        return {
            name: self.flat[offset : offset + math.prod(shape)].view(shape)
            for name, shape, offset in self.layout
        }

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        p = self.views()
        h = F.relu(F.linear(x, p["net.0.weight"], p["net.0.bias"]))
        h = F.relu(F.linear(h, p["net.2.weight"], p["net.2.bias"]))
        return F.linear(h, p["net.4.weight"], p["net.4.bias"])
