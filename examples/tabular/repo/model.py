"""A three-layer perceptron for binary outcomes (logits out)."""

from torch import nn


def make_model(n_features: int, hidden: int = 64) -> nn.Module:
    return nn.Sequential(nn.Linear(n_features, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1))
