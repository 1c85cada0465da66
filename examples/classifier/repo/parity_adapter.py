"""ladder's parity adapter for this repo (the reference side): see ladder/parity/side.py for the convention.

It runs this repo's own training code, not a copy of it: the model is train.MLP, the loss, gradients
and optimizer steps are those of train.main, which runs on one fixed batch with dropout off and is
stopped after `steps` optimizer steps. So a change anywhere in that code shows in the tensors.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from typing import Any

import numpy as np
import torch

import train
from data import N_CLASSES, N_FEATURES, make_dataset, train_batches

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
    torch.manual_seed(seed)
    model = train.MLP(N_FEATURES, HIDDEN, N_CLASSES, dropout=0.0)
    drawn = {k: _numpy(v) for k, v in model.state_dict().items()}
    if weights is not None:
        model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in drawn}, strict=True)
    if batch is None:  # the first `steps` training batches, stacked: outputs, loss and gradients use the first
        x_train, y_train, _, _ = make_dataset()
        stream = train_batches(x_train, y_train, train.parse_args([]).batch_size, seed=seed)
        xs, ys = zip(*(next(stream) for _ in range(max(steps, 1))))
        batch = {"x": np.stack(xs), "y": np.stack(ys)}
    with torch.no_grad():
        outputs = _numpy(model(torch.from_numpy(batch["x"][0])))

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
        train.main(["--seed", str(seed), "--device", "cpu"])
    except _Enough:
        pass
    names = list(drawn)
    return {"weights": drawn if weights is None else None, "batch": batch, "outputs": outputs,
            "loss": float(seen["loss"]), "grads": {k: _numpy(g) for k, g in zip(names, seen["grads"])},
            "params": {k: _numpy(v) for k, v in model.state_dict().items()},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}


def evaluate(weights: Mapping[str, np.ndarray]) -> float:
    """This repo's evaluation (test accuracy) of trained weights keyed by this model's names."""
    model = train.MLP(N_FEATURES, HIDDEN, N_CLASSES, dropout=0.0)
    state = model.state_dict()
    weights.require({k: tuple(v.shape) for k, v in state.items()})  # type: ignore[attr-defined]
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in state}, strict=True)
    _, _, x_test, y_test = make_dataset()
    _, _, acc = train.evaluate(model, x_test, y_test, torch.device("cpu"))
    return acc
