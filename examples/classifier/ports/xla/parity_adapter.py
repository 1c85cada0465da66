"""ladder's parity adapter for the PyTorch/XLA port: see ladder/parity/side.py for the convention.

The reference's weights load by name into this port's model (the same parameter names and layouts as
torch.nn), which then runs on the XLA device. Forward outputs, the loss and the shard-averaged
gradient come from this port's own code, and so do the optimizer steps: train.main runs on the one
fixed batch with dropout off and is stopped after `steps` optimizer steps.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch
import torch_xla

import train
from data import N_CLASSES, N_FEATURES

HIDDEN = 128


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _fixed_batches(batch: Mapping[str, np.ndarray]) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One batch per step (batch["x"][i] for step i), then stop."""
    yield from zip(batch["x"], batch["y"])
    raise _Enough


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    device = torch_xla.device()
    model = train.MLP(N_FEATURES, HIDDEN, N_CLASSES, dropout=0.0)
    names = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in names}, strict=True)
    model.to(device)
    with torch.no_grad():
        outputs = _numpy(model(torch.from_numpy(batch["x"][0]).to(device)))

    seen: dict[str, Any] = {}
    shard_gradients = train.shard_gradients

    def recording(*args: Any, **kwargs: Any) -> Any:
        grads, loss = shard_gradients(*args, **kwargs)
        if "loss" not in seen:  # the first step: the gradient of the initial weights, read after the run
            seen["loss"], seen["grads"] = loss, train.all_reduce_mean(grads)
        return grads, loss

    train.MLP = lambda *a, **k: model
    train.shard_gradients = recording
    train.train_batches = lambda *a, **k: _fixed_batches(batch)
    try:
        train.main(["--seed", str(seed), "--device", "xla"])
    except _Enough:
        pass
    return {"outputs": outputs, "loss": float(seen["loss"]),
            "grads": {k: _numpy(g) for k, g in zip(names, seen["grads"])},
            "params": {k: _numpy(v) for k, v in model.state_dict().items()},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}

