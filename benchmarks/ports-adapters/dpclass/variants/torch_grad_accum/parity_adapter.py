"""Parity adapter for dpclass, PyTorch DDP side with gradient accumulation (ladder/parity/side.py has the
convention). The reference's DDP adapter, except for the loss it records: the side runs ACCUM_STEPS
backward() calls per optimizer step (micro-batch losses already divided by ACCUM_STEPS), so the step's
loss is the sum of the losses backpropagated before the first clip, not the first backward's loss.

It runs the side's own train.worker in WORLD_SIZE processes (gloo, DDP), as train.main does. In each
process the adapter only swaps: train.ConvNet returns a model holding the given weights with dropout off,
train.make_dataset returns the fixed global batches as the training set, and the train sampler hands rank
r its half of each (rank 0's 32 items first, as the global batch is laid out), and the run stops after
`steps` optimizer steps. The loss (averaged over the ranks: the global-batch mean), the DDP-averaged
gradient, clipping, Adam and the schedule are the side's own. The gradient is read where the side's clip
receives it (after anything the side does to it between backward() and the clip, as the JAX adapters read
it at the optimizer's input), or after backward() when the side does not clip. The reference side first runs the workers
unchanged for `steps` steps to draw its initial weights (rank 0's) and its first global batches.
"""

from __future__ import annotations

import os
import pickle
import tempfile
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch
import torch.multiprocessing as mp
from torch.optim.optimizer import register_optimizer_step_post_hook

import train

_SAMPLER = train.DistributedSampler  # the real one: the test split keeps it

class _Enough(Exception):
    """Stops train.worker once it has taken the steps parity asks for."""


def _numpy(t: torch.Tensor) -> np.ndarray:
    return t.detach().cpu().numpy().copy()


class _FixedSampler(torch.utils.data.Sampler):
    """Rank r's items of the fixed global batches, in order: batch i holds items [i*B, (i+1)*B)."""

    def __init__(self, n: int, rank: int, world: int) -> None:
        per = train.PER_RANK_BATCH
        self.order = [i * per * world + rank * per + j for i in range(n // (per * world)) for j in range(per)]

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self) -> Any:
        return iter(self.order)

    def __len__(self) -> int:
        return len(self.order)


def _fixed(data: Any, *a: Any, rank: int = 0, num_replicas: int = 1, shuffle: bool = True, **k: Any) -> Any:
    """A stand-in for the train sampler (DistributedSampler or a hand-written one); the test one is kept."""
    if not shuffle:
        return _SAMPLER(data, *a, rank=rank, num_replicas=num_replicas, shuffle=shuffle, **k)
    return _FixedSampler(data if isinstance(data, int) else len(data), rank, num_replicas)


def _patch_fixed(weights: Mapping[str, np.ndarray], batch: Mapping[str, np.ndarray], rec: dict) -> None:
    model = train.ConvNet(train.N_CLASSES, dropout=0.0)
    model.load_state_dict({k: torch.from_numpy(np.array(v)) for k, v in weights.items()}, strict=True)
    rec["model"] = model
    make_dataset = train.make_dataset
    x, y = batch["x"].reshape(-1, *batch["x"].shape[2:]), batch["y"].reshape(-1)
    train.ConvNet = lambda *a, **k: model
    train.make_dataset = lambda *a, **k: (x, y, *make_dataset()[2:])
    train.DistributedSampler = _fixed
    if hasattr(train, "ShardedShuffleSampler"):
        train.ShardedShuffleSampler = _fixed


def _patch_draw(rec: dict) -> None:
    convnet, loader = train.ConvNet, train.DataLoader

    def model(*a: Any, **k: Any) -> torch.nn.Module:
        m = convnet(*a, **k)
        rec["weights"] = {n: _numpy(v) for n, v in m.state_dict().items()}
        return m

    class Recording:
        def __init__(self, inner: Any) -> None:
            self.inner = inner

        def __len__(self) -> int:
            return len(self.inner)

        def __iter__(self) -> Any:
            for xb, yb in self.inner:
                rec.setdefault("batches", []).append((_numpy(xb), _numpy(yb)))
                yield xb, yb

    train.ConvNet = model
    train.DataLoader = lambda ds, **k: Recording(loader(ds, **k)) if k.get("drop_last") else loader(ds, **k)


def _child(rank: int, port: int, steps: int, seed: int, inputs: Any, out: str) -> None:
    """One rank: patch, run train.worker until `steps` updates, write what this rank saw to out/rank.pkl."""
    rec: dict[str, Any] = {}
    if inputs is None:
        _patch_draw(rec)
    else:
        _patch_fixed(*inputs, rec)
    backward, count = torch.Tensor.backward, [0]

    def recording(loss: torch.Tensor, *a: Any, **k: Any) -> None:
        backward(loss, *a, **k)
        if "model" in rec and not rec.get("grads_at_clip"):  # every micro-batch of the first step
            rec["loss"] = rec.get("loss", 0.0) + float(loss.detach())

    def stop(*_: Any) -> None:
        count[0] += 1
        if count[0] >= steps:
            raise _Enough

    clip = torch.nn.utils.clip_grad_norm_

    def clipping(parameters: Any, *a: Any, **k: Any) -> Any:
        if "model" in rec and not rec.get("grads_at_clip"):
            rec["grads"] = {n: _numpy(p.grad) for n, p in rec["model"].named_parameters()}
            rec["grads_at_clip"] = True
        return clip(parameters, *a, **k)

    torch.Tensor.backward = recording  # type: ignore[method-assign]
    torch.nn.utils.clip_grad_norm_ = clipping
    handle = register_optimizer_step_post_hook(stop)
    try:
        train.worker(rank, port, train.parse_args(["--seed", str(seed), "--steps", "200"]))
    except _Enough:
        train.dist.destroy_process_group()
    handle.remove()
    rec.pop("grads_at_clip", None)
    if "model" in rec:
        rec["params"] = {n: _numpy(v) for n, v in rec.pop("model").state_dict().items()}
    with open(os.path.join(out, f"{rank}.pkl"), "wb") as f:
        pickle.dump(rec, f)


def _spawn(steps: int, seed: int, inputs: Any) -> list[dict[str, Any]]:
    with tempfile.TemporaryDirectory() as out:
        mp.spawn(_child, args=(train.free_port(), steps, seed, inputs, out), nprocs=train.WORLD_SIZE, join=True)
        recs = []
        for r in range(train.WORLD_SIZE):
            with open(os.path.join(out, f"{r}.pkl"), "rb") as f:
                recs.append(pickle.load(f))
    return recs


def parity(weights: Mapping[str, np.ndarray] | None, batch: Mapping[str, np.ndarray] | None, *,
           steps: int, seed: int) -> dict[str, Any]:
    drawn = None
    if weights is None or batch is None:
        recs = _spawn(steps, seed, None)
        drawn = recs[0]["weights"]
        halves = [r["batches"][:steps] for r in recs]
        batch = {"x": np.stack([np.concatenate([h[i][0] for h in halves]) for i in range(steps)]),
                 "y": np.stack([np.concatenate([h[i][1] for h in halves]) for i in range(steps)])}
        weights = drawn
    weights = {k: np.array(weights[k]) for k in weights}
    probe = train.ConvNet(train.N_CLASSES, dropout=0.0)
    probe.load_state_dict({k: torch.from_numpy(v) for k, v in weights.items()}, strict=True)
    with torch.no_grad():
        outputs = _numpy(probe.eval()(torch.from_numpy(batch["x"][0])))
    recs = _spawn(steps, seed, (weights, dict(batch)))
    names = list(probe.state_dict())
    return {"weights": drawn, "batch": batch if drawn else None, "outputs": outputs,
            "loss": float(np.mean([r["loss"] for r in recs])), "grads": recs[0]["grads"],
            "params": recs[0]["params"],
            "transplant": [{"target": k, "source": k, "transpose": False} for k in names]}
