"""Parity adapter for regress, PyTorch/XLA ports run as a launcher of worker processes (xla_launcher_resume).

The reference torch/XLA adapter with one change: train.main is called as ONE in-process worker that runs
the whole step budget from a fresh start (`--worker --start 0`), instead of as the launcher that would
start worker subprocesses out of the adapter's reach. A fresh worker seeds and builds everything like the
reference's main and never reaches its checkpoint in `steps` updates.

It runs the side's own train.main. The adapter only swaps three things: train.MLP returns a model
holding the given weights, train.make_dataset returns the fixed batches as the training set (in order:
the train loader's shuffle is turned off), and the run stops after `steps` optimizer steps. Loss,
gradients, the optimizer and the schedule are the side's own. The reference side first runs train.main
unchanged for `steps` steps to draw its own initial weights and its first training batches.
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


WORKER = ["--worker", "--start", "0"]  # one in-process worker from a fresh start (no launcher)


def _run(argv: list[str], steps: int, seen: dict[str, Any]) -> None:
    """train.main (one worker) until `steps` updates; the first backward's loss and gradients land in `seen`."""
    argv = [*argv, *WORKER]
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


def _draw(steps: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The reference's own initial weights and first `steps` training batches (train.main, unchanged)."""
    mlp, loader, models, batches = train.MLP, train.DataLoader, [], []

    class Recording:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __len__(self) -> int:
            return len(self.inner)

        def __iter__(self) -> Any:
            for xb, yb in self.inner:
                batches.append((_numpy(xb), _numpy(yb)))
                yield xb, yb

    def model(*a: Any, **k: Any) -> torch.nn.Module:
        models.append(mlp(*a, **k))
        models.append({n: _numpy(v) for n, v in models[0].state_dict().items()})
        return models[0]

    train.MLP = model
    train.DataLoader = lambda ds, **k: Recording(loader(ds, **k)) if k.get("shuffle") else loader(ds, **k)
    _run([], steps, {"loss": None})  # records nothing
    train.MLP, train.DataLoader = mlp, loader
    xs, ys = zip(*batches[:steps])
    return models[1], {"x": np.stack(xs), "y": np.stack(ys)}


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    drawn = None
    if weights is None or batch is None:
        drawn, batch = _draw(steps)
        weights = drawn
    model = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    names = list(model.state_dict())
    model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in names}, strict=True)
    probe = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    probe.load_state_dict(model.state_dict())
    with torch.no_grad():
        outputs = _numpy(probe.eval().to(_device())(torch.from_numpy(batch["x"][0]).to(_device())))

    make_dataset, loader = train.make_dataset, train.DataLoader
    x = batch["x"].reshape(-1, batch["x"].shape[-1])
    y = batch["y"].reshape(-1, batch["y"].shape[-1])
    train.make_dataset = lambda: (x, y, *make_dataset()[2:])
    train.MLP = lambda *a, **k: model
    train.DataLoader = lambda ds, **k: loader(ds, **{**k, "shuffle": False})
    if hasattr(train, "epoch_batches"):  # a port that shuffles by hand: its batches in order
        train.epoch_batches = lambda xt, yt, bs: ((xt[i:i + bs], yt[i:i + bs]) for i in range(0, len(xt), bs))
    seen: dict[str, Any] = {"model": model}
    _run(["--steps", "400"], steps, seen)
    return {"weights": drawn, "batch": batch if drawn else None, "outputs": outputs,
            "loss": float(seen["loss"]), "grads": {k: _numpy(g) for k, g in seen["grads"].items()},
            "params": {k: _numpy(v) for k, v in model.state_dict().items()},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}
