"""Parity adapter for regress's benign_xla_flat_param port (ladder/parity/side.py has the convention).

A copy of reference/parity_adapter.py (port side only) for a port whose model keeps ONE flat parameter,
`flat`, holding net.0.weight, net.0.bias, ..., net.4.bias back to back (model.MLP.layout gives each
reference name, shape and offset): the reference's tensors are flattened into it going in, and the port's
gradient and parameter are cut back into the reference's names and shapes coming out. Everything else as the reference's adapter, whose notes follow.

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
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    model = train.MLP(train.N_FEATURES, train.parse_args([]).hidden)
    layout = model.layout  # (reference name, shape, offset into flat)
    flat = np.concatenate([np.array(weights[name], dtype=np.float32).reshape(-1) for name, _, _ in layout])
    model.load_state_dict({"flat": torch.from_numpy(flat)}, strict=True)
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

    def split(tree: Mapping[str, torch.Tensor]) -> dict[str, np.ndarray]:
        flat_np = _numpy(tree["flat"])
        return {name: flat_np[offset:offset + int(np.prod(shape))].reshape(shape).copy()
                for name, shape, offset in layout}

    transplant = [{"target": f"flat[{offset}:{offset + int(np.prod(shape))}].view{shape}", "source": name,
                   "transpose": False} for name, shape, offset in layout]
    return {"outputs": outputs, "loss": float(seen["loss"]), "grads": split(seen["grads"]),
            "params": split(model.state_dict()), "transplant": transplant}
