"""Parity adapter for charlm's xla_encoder_layer_* ports (PyTorch/XLA; ladder/parity/side.py has the convention).

The reference adapter (charlm/reference/parity_adapter.py) with one change: the port's blocks are
torch.nn.TransformerEncoderLayer, so its parameters have the layer's names. The same tensors in the same
layouts: c_attn -> self_attn.in_proj_weight / in_proj_bias ((3C, C), q, k, v rows in c_attn's order),
attn.c_proj -> self_attn.out_proj, mlp.c_fc -> linear1, mlp.c_proj -> linear2, ln_1 -> norm1, ln_2 -> norm2.
The reference's weights are loaded under the port's names, and its gradients and parameters are handed back
under the reference's names (no transposes). Everything else as there:

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


_RENAMES = [("attn.c_attn.weight", "self_attn.in_proj_weight"), ("attn.c_attn.bias", "self_attn.in_proj_bias"),
            ("attn.c_proj.", "self_attn.out_proj."), ("mlp.c_fc.", "linear1."), ("mlp.c_proj.", "linear2."),
            ("ln_1.", "norm1."), ("ln_2.", "norm2.")]


def _port_name(name: str) -> str:
    """reference parameter name -> the port's (h.0.attn.c_attn.weight -> h.0.self_attn.in_proj_weight)."""
    for old, new in _RENAMES:
        if old in name:
            return name.replace(old, new)
    return name


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
    port_names = [n for n, _ in model.named_parameters()]
    ref_of = {_port_name(k): k for k in weights}
    assert sorted(ref_of) == sorted(port_names), (sorted(ref_of), sorted(port_names))
    missing, unexpected = model.load_state_dict(
        {p: torch.from_numpy(np.array(weights[ref_of[p]])) for p in port_names}, strict=False)
    assert not unexpected and not missing, (missing, unexpected)
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
            "loss": float(seen["loss"]), "grads": {ref_of[k]: _numpy(g) for k, g in seen["grads"].items()},
            "params": {ref_of[k]: _numpy(p) for k, p in model.named_parameters()},
            "transplant": [{"target": p, "source": ref_of[p], "transpose": False} for p in port_names]}
