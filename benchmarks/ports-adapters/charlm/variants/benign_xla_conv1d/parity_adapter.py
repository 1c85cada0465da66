"""Parity adapter for charlm's benign_xla_conv1d (PyTorch/XLA; ladder/parity/side.py has the convention).

The reference adapter (charlm/reference/parity_adapter.py) with one change: the port's c_attn, c_proj and
c_fc are HF GPT-2 Conv1D modules whose weight is stored (in, out), the transpose of nn.Linear's (out, in).
The reference's weights are loaded transposed into those modules, and their gradients and parameters are
handed back transposed to the reference's layout (listed with transpose = True). Everything else as there:

It runs the side's own train.main. The adapter only swaps: train.GPT returns a model holding the given
weights, the batch source (train.get_batch, or the RandomWindows dataset of the MpDeviceLoader ports)
hands out the fixed batches in order, and the run stops after `steps` optimizer steps. Loss, gradient,
clipping, AdamW with its two groups and the hand-set schedule are the side's own (charlm has no dropout).
Weights are the parameters only (the causal mask is a buffer the model builds).
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
    return t.detach().cpu().numpy().copy()


def _device() -> torch.device:
    if "xs" in train.__dict__:  # an SPMD port: SPMD mode before any tensor is on the device, as its main does
        train.xr.use_spmd()
    return train.torch_xla.device() if XLA else torch.device("cpu")


def _new_model() -> torch.nn.Module:
    train_data, _, vocab = train.make_dataset()
    return train.GPT(train.GPTConfig(vocab_size=len(vocab), block_size=train.BLOCK_SIZE))


def _conv1d_weights(model: torch.nn.Module) -> set[str]:
    """Names of the parameters stored transposed: the weight of every Conv1D module."""
    return {f"{name}.weight" for name, module in model.named_modules() if type(module).__name__ == "Conv1D"}


def _ref_layout(name: str, a: np.ndarray, transposed: set[str]) -> np.ndarray:
    return a.T.copy() if name in transposed else a


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
    if weights is None or batch is None:
        raise ValueError("the port is the target side: it takes the reference's weights and batch")
    model = _new_model()
    names = [n for n, _ in model.named_parameters()]
    transposed = _conv1d_weights(model)
    state = {k: torch.from_numpy(np.ascontiguousarray(_ref_layout(k, np.array(weights[k]), transposed)))
             for k in names}
    missing, unexpected = model.load_state_dict(state, strict=False)
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
    return {"weights": None, "batch": None, "outputs": outputs,
            "loss": float(seen["loss"]),
            "grads": {k: _ref_layout(k, _numpy(g), transposed) for k, g in seen["grads"].items()},
            "params": {k: _ref_layout(k, _numpy(p), transposed) for k, p in model.named_parameters()},
            "transplant": [{"target": k, "source": k, "transpose": k in transposed} for k in names]}
