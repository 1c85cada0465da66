"""Parity adapter for dpclass, PyTorch/XLA side (ladder/parity/side.py has the convention).

It runs the port's own training function in this process: train.main, or train._mp_fn(0, args) for the
xmp.spawn recipe (one replica, as that port runs on the CPU). The adapter only swaps: train.ConvNet
returns a model holding the reference's weights with dropout off, train.make_dataset returns the fixed
global batches as the training set, and the port's batch source (global_batches, or the train
DistributedSampler) hands them out in order; the run stops after `steps` optimizer steps. (The
xla_dropout_in_eval adapter, for a port whose loader reads ahead of the step, e.g. a DataLoader
wrapped in MpDeviceLoader, whose background thread prefetches: global_batches hands out the fixed
batches in order and then over again instead of raising at their end, so reading ahead never
exhausts the source; the optimizer-step hook still stops the run.) Loss, gradient,
clipping, Adam and the schedule are the port's own, on the XLA device.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch_xla
from torch.optim.optimizer import register_optimizer_step_post_hook

import train


class _Enough(Exception):
    """Stops the training loop once it has taken the steps parity asks for."""


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


class _InOrder(torch.utils.data.Sampler):
    """The train sampler's stand-in: every item in order (one replica)."""

    def __init__(self, n: int) -> None:
        self.n = n

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self) -> Any:
        return iter(range(self.n))

    def __len__(self) -> int:
        return self.n


def _patch(model: torch.nn.Module, batch: Mapping[str, np.ndarray]) -> None:
    make_dataset, sampler, per_step = train.make_dataset, train.DistributedSampler, batch["x"].shape[1]
    x, y = batch["x"].reshape(-1, *batch["x"].shape[2:]), batch["y"].reshape(-1)

    def in_order(n: int, seed: int) -> Any:
        while True:  # a prefetching loader reads ahead of the step: the source must not run out
            yield from np.arange(n).reshape(-1, per_step)

    train.ConvNet = lambda *a, **k: model
    train.make_dataset = lambda *a, **k: (x, y, *make_dataset()[2:])
    train.global_batches = in_order
    train.DistributedSampler = lambda ds, *a, shuffle=True, **k: (
        _InOrder(len(ds)) if shuffle else sampler(ds, *a, shuffle=shuffle, **k))


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    if "xs" in train.__dict__:  # an SPMD port: SPMD mode before any tensor is on the device, as its main does
        train.xr.use_spmd()
    device = torch_xla.device()
    model = train.ConvNet(train.N_CLASSES, dropout=0.0)
    names = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in names}, strict=True)
    probe = train.ConvNet(train.N_CLASSES, dropout=0.0)
    probe.load_state_dict(model.state_dict())
    with torch.no_grad():
        outputs = _numpy(probe.eval().to(device)(torch.from_numpy(batch["x"][0]).to(device)))

    seen: dict[str, Any] = {}
    backward, count = torch.Tensor.backward, [0]

    def recording(loss: torch.Tensor, *a: Any, **k: Any) -> None:
        backward(loss, *a, **k)
        if "loss" not in seen:
            seen["loss"] = loss.detach().clone()
            seen["grads"] = {n: p.grad.detach().clone() for n, p in model.named_parameters()}

    def stop(*_: Any) -> None:
        count[0] += 1
        if count[0] >= steps:
            raise _Enough

    _patch(model, batch)
    args = train.parse_args(["--seed", str(seed), "--steps", "200"])
    torch.Tensor.backward = recording  # type: ignore[method-assign]
    handle = register_optimizer_step_post_hook(stop)
    try:
        train._mp_fn(0, args) if hasattr(train, "_mp_fn") else train.main(["--seed", str(seed), "--steps", "200"])
    except _Enough:
        pass
    finally:
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        handle.remove()
    return {"outputs": outputs, "loss": float(seen["loss"]),
            "grads": {k: _numpy(g) for k, g in seen["grads"].items()},
            "params": {k: _numpy(v) for k, v in model.state_dict().items()},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}
