"""Parity adapter for regress's xla_device_dataset port (ladder/parity/side.py has the convention).

The regress torch/XLA adapter (reference/parity_adapter.py), for a port without DataLoaders: both splits
are copied to the device once and train.index_batches(n, batch_size) yields the host index batches of
each epoch (a torch.randperm permutation). The adapter swaps train.make_dataset for the fixed batches, as
that adapter does, and train.index_batches for in-order index batches (0..127, 128..255, ...), so the
port gathers the fixed batches in order on the device. Model, loss, gradients, optimizer and schedule are
the port's own; the run stops after `steps` optimizer steps. Only the target side is supported (the port
has no DataLoader to draw the reference's batches from).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import train

XLA = "torch_xla" in train.__dict__  # a PyTorch/XLA port imports torch_xla in train.py


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


def _device() -> torch.device:
    if "xs" in train.__dict__:  # an SPMD port: SPMD mode before any tensor is on the device, as its main does
        train.xr.use_spmd()
    return train.torch_xla.device() if XLA else torch.device("cpu")


def _stop_after(steps: int) -> Any:
    """A global optimizer-step hook that ends the run after `steps` steps (the update itself is done)."""
    count = [0]

    def hook(*_: Any) -> None:
        count[0] += 1
        if count[0] >= steps:
            raise _Enough

    return register_optimizer_step_post_hook(hook)


def _run(argv: list[str], steps: int, seen: dict[str, Any]) -> None:
    """train.main until `steps` updates; the first backward's loss and gradients land in `seen`."""
    backward = torch.Tensor.backward

    def recording(loss: torch.Tensor, *a: Any, **k: Any) -> None:
        backward(loss, *a, **k)
        if "loss" not in seen:
            seen["loss"] = loss.detach().clone()
            seen["grads"] = {n: p.grad.detach().clone() for n, p in seen["model"].named_parameters()}

    handle = _stop_after(steps)
    torch.Tensor.backward = recording  # type: ignore[method-assign]
    try:
        train.main(argv)
    except _Enough:
        pass
    finally:
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        handle.remove()


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    drawn = None
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    model = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    names = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in names}, strict=True)
    probe = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    probe.load_state_dict(model.state_dict())
    with torch.no_grad():
        outputs = _numpy(probe.eval().to(_device())(torch.from_numpy(batch["x"][0]).to(_device())))

    make_dataset = train.make_dataset
    x = batch["x"].reshape(-1, batch["x"].shape[-1])
    y = batch["y"].reshape(-1, batch["y"].shape[-1])
    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.MLP = lambda *a, **k: model
    train.index_batches = lambda n, bs: (torch.arange(i, i + bs) for i in range(0, n - bs + 1, bs))
    seen: dict[str, Any] = {"model": model}
    _run(["--steps", "400"], steps, seen)
    return {"weights": drawn, "batch": batch if drawn else None, "outputs": outputs,
            "loss": float(seen["loss"]), "grads": {k: _numpy(g) for k, g in seen["grads"].items()},
            "params": {k: _numpy(v) for k, v in model.state_dict().items()},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}
