"""Parity adapter for regress, functional PyTorch side (torch.func step, hand-written SGD: train.sgd_update).

ladder/parity/side.py has the convention. It runs the port's own train.main. The adapter only swaps:
train.MLP returns a model holding the given weights, train.make_dataset returns the fixed batches as the
training set (in order: the train loader's shuffle is turned off), train.sgd_update (looked up when a step
runs) is wrapped to copy the first gradients it receives, and the step built by train.make_train_step is
wrapped to keep the first loss and to stop the run after `steps` updates. Loss, gradients (grad_and_value
over functional_call), the update rule and the schedule are the port's own. The port updates the model's
parameters in place (its parameter dict holds detached views of them), so the model's state_dict after
the run holds the trained parameters.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

import train


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    model = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    names = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in names}, strict=True)
    probe = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    probe.load_state_dict(model.state_dict())
    with torch.no_grad():
        outputs = _numpy(probe.eval()(torch.from_numpy(batch["x"][0])))

    make_dataset, loader = train.make_dataset, train.DataLoader
    sgd_update, make_train_step = train.sgd_update, train.make_train_step
    x = batch["x"].reshape(-1, batch["x"].shape[-1])
    y = batch["y"].reshape(-1, batch["y"].shape[-1])
    seen: dict[str, Any] = {}
    count = [0]

    def recording_update(params: Any, grads: Any, *a: Any, **k: Any) -> Any:
        seen.setdefault("grads", {n: _numpy(g) for n, g in grads.items()})
        return sgd_update(params, grads, *a, **k)

    def recording_make(*a: Any, **k: Any) -> Any:
        step = make_train_step(*a, **k)

        def wrapped(*sa: Any, **sk: Any) -> Any:
            loss = step(*sa, **sk)
            seen.setdefault("loss", float(loss))
            count[0] += 1
            if count[0] >= steps:
                raise _Enough
            return loss

        return wrapped

    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.MLP = lambda *a, **k: model
    train.DataLoader = lambda ds, **k: loader(ds, **{**k, "shuffle": False})
    train.sgd_update = recording_update
    train.make_train_step = recording_make
    try:
        train.main(["--steps", "400"])
    except _Enough:
        pass
    return {"outputs": outputs, "loss": seen["loss"], "grads": seen["grads"],
            "params": {k: _numpy(v) for k, v in model.state_dict().items()},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}
