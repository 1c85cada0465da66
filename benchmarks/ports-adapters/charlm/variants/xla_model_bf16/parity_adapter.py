"""Parity adapter for charlm's xla_model_bf16: the reference adapter (PyTorch and PyTorch/XLA sides; ladder/parity/side.py
has the convention), except that tensors are widened to float32 before they go to numpy, since this port casts the
model (the transplanted weights included) to bfloat16 and numpy has no bfloat16. Nothing else differs.

It runs the side's own train.main. The adapter only swaps: train.GPT returns a model holding the given
weights, the batch source (train.get_batch, or the RandomWindows dataset of the MpDeviceLoader ports)
hands out the fixed batches in order, and the run stops after `steps` optimizer steps. Loss, gradient,
clipping, AdamW with its two groups and the hand-set schedule are the side's own (charlm has no dropout).
The reference side first runs train.main unchanged for `steps` steps to draw its own initial weights and
its first training batches. Weights are the parameters only (the causal mask is a buffer the model builds).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
from torch.optim.optimizer import register_optimizer_step_post_hook

import train

XLA = "torch_xla" in train.__dict__  # a PyTorch/XLA port imports torch_xla in train.py
ARGV = ["--seed", "0", "--steps", "300", "--eval-every", "100"]


class _Enough(Exception):
    """Stops train.main once it has taken the steps parity asks for."""


def _numpy(t: torch.Tensor) -> np.ndarray:
    t = t.detach().cpu()
    return (t.float() if t.is_floating_point() else t).numpy().copy()


def _device() -> torch.device:
    if "xs" in train.__dict__:  # an SPMD port: SPMD mode before any tensor is on the device, as its main does
        train.xr.use_spmd()
    return train.torch_xla.device() if XLA else torch.device("cpu")


def _new_model() -> torch.nn.Module:
    train_data, _, vocab = train.make_dataset()
    return train.GPT(train.GPTConfig(vocab_size=len(vocab), block_size=train.BLOCK_SIZE))


def _run(steps: int, seen: dict[str, Any]) -> None:
    """train.main until `steps` updates; the first backward's loss and gradients land in `seen`."""
    backward, count = torch.Tensor.backward, [0]

    def recording(loss: torch.Tensor, *a: Any, **k: Any) -> None:
        backward(loss, *a, **k)
        if "loss" not in seen:
            seen["loss"] = loss.detach().clone()
            seen["grads"] = {n: p.grad.detach().clone() for n, p in seen["model"].named_parameters()}

    def stop(*_: Any) -> None:
        count[0] += 1
        if count[0] >= steps:
            raise _Enough

    handle = register_optimizer_step_post_hook(stop)
    torch.Tensor.backward = recording  # type: ignore[method-assign]
    try:
        train.main(ARGV)
    except _Enough:
        pass
    finally:
        torch.Tensor.backward = backward  # type: ignore[method-assign]
        handle.remove()


def _draw(steps: int) -> tuple[dict[str, np.ndarray], dict[str, np.ndarray]]:
    """The reference's own initial weights and first `steps` batches (train.main, unchanged)."""
    gpt, get_batch, seen, batches = train.GPT, train.get_batch, {"loss": None}, []

    def model(*a: Any, **k: Any) -> torch.nn.Module:
        seen["model"] = gpt(*a, **k)
        seen["weights"] = {n: _numpy(p) for n, p in seen["model"].named_parameters()}
        return seen["model"]

    def recording(*a: Any, **k: Any) -> Any:
        batches.append(get_batch(*a, **k))
        return batches[-1]

    train.GPT, train.get_batch = model, recording
    _run(steps, seen)
    train.GPT, train.get_batch = gpt, get_batch
    return seen["weights"], {"x": np.stack([b[0] for b in batches]), "y": np.stack([b[1] for b in batches])}


def _feed(batch: Mapping[str, np.ndarray]) -> None:
    """The fixed batches, in order, from whichever batch source the side has."""
    pairs = list(zip(batch["x"], batch["y"]))
    stream = iter(pairs)
    train.get_batch = lambda *a, **k: next(stream)

    class Fixed(torch.utils.data.IterableDataset):
        def __init__(self, *a: Any, **k: Any) -> None:
            pass

        def __iter__(self) -> Any:
            return ((torch.from_numpy(x), torch.from_numpy(y)) for x, y in pairs)

    if hasattr(train, "RandomWindows"):
        train.RandomWindows = Fixed


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    drawn = None
    if weights is None or batch is None:
        drawn, batch = _draw(steps)
        weights = drawn
    model = _new_model()
    names = [n for n, _ in model.named_parameters()]
    missing, unexpected = model.load_state_dict({k: torch.from_numpy(np.array(weights[k])) for k in names},
                                                strict=False)
    assert not unexpected and all(k.endswith("attn.bias") for k in missing), (missing, unexpected)
    probe = _new_model()
    probe.load_state_dict(model.state_dict())
    with torch.no_grad():
        x0 = torch.from_numpy(batch["x"][0]).to(_device())
        outputs = _numpy(probe.eval().to(_device())(x0, torch.from_numpy(batch["y"][0]).to(_device()))[0])
    seen: dict[str, Any] = {"model": model}
    train.GPT = lambda *a, **k: model
    _feed(batch)
    _run(steps, seen)
    return {"weights": drawn, "batch": batch if drawn else None, "outputs": outputs,
            "loss": float(seen["loss"]), "grads": {k: _numpy(g) for k, g in seen["grads"].items()},
            "params": {k: _numpy(p) for k, p in model.named_parameters()},
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}
