"""Train the ConvNet on the synthetic pattern images (PyTorch/XLA port, SPMD, sharded input pipeline).

Port notes: the reference runs DistributedDataParallel over 2 CPU processes (per-rank batch 32).
Here torch_xla's SPMD mode (xr.use_spmd()) runs one program over a 1-d mesh of all the PJRT
devices (2 CPU devices with CPU_NUM_DEVICES=2, one per reference rank). The input pipeline is
torch_xla's SPMD recipe: a DataLoader of {"image", "label"} dicts whose batch_sampler yields the
global batches, wrapped in MpDeviceLoader(..., input_sharding={...}) with a ShardingSpec per key
(images split along the batch dimension over the "data" axis, labels likewise), so each batch
arrives on the device already sharded (32 items per device: rank 0's on device 0, rank 1's on
device 1); the parameters stay replicated, and the XLA partitioner splits the forward/backward
and inserts the gradient all-reduce. MpDeviceLoader cuts the step's graph when the next batch is
taken. The program is
written for the global batch: the loss is the mean over all 64 items (GroupNorm has per-sample
statistics), so its gradient is DDP's averaged gradient, and clip_grad_norm_(1.0) clips that
averaged gradient. The global batches are the reference's: for every epoch the
DistributedSampler of each of the 2 ranks is rebuilt (same seed, set_epoch) and the two 32-item
halves are concatenated (rank 0's first). torch_xla.sync() cuts one graph per step; host reads
(.item()) only on logging steps and at the end of an evaluation.
Run with PJRT_DEVICE=CPU CPU_NUM_DEVICES=2.

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps (mean loss over the global batch)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
from torch import nn
from torch.utils.data import DataLoader, Dataset, Sampler
from torch.utils.data.distributed import DistributedSampler

from data import N_CLASSES, make_dataset
from model import ConvNet

WORLD_SIZE = 2  # the reference's ranks: the global batch is built from their two samplers
PER_RANK_BATCH = 32
GLOBAL_BATCH = WORLD_SIZE * PER_RANK_BATCH
EVAL_BATCH = 512
LOG_EVERY = 10
LR = 1e-3
BETAS = (0.9, 0.98)
EPS = 1e-8
WEIGHT_DECAY = 5e-4
CLIP_NORM = 1.0
LABEL_SMOOTHING = 0.1
WARMUP_FRACTION = 0.05
MIN_LR_RATIO = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    return p.parse_args(argv)


def lr_factor(step: int, total_steps: int) -> float:
    """Linear warmup over the first 5% of steps, then cosine decay to MIN_LR_RATIO; step counts from 0."""
    warmup = max(1, int(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))


def global_batches(n: int, seed: int) -> Iterator[np.ndarray]:
    """Index arrays of the reference's global batches: rank 0's 32 items, then rank 1's, epoch after epoch."""
    samplers = [
        DistributedSampler(range(n), num_replicas=WORLD_SIZE, rank=r, shuffle=True, seed=seed, drop_last=True)
        for r in range(WORLD_SIZE)
    ]
    epoch = 0
    while True:
        shards = []
        for s in samplers:
            s.set_epoch(epoch)
            shards.append(np.fromiter(iter(s), dtype=np.int64))
        for b in range(len(shards[0]) // PER_RANK_BATCH):
            sl = slice(b * PER_RANK_BATCH, (b + 1) * PER_RANK_BATCH)
            yield np.concatenate([shard[sl] for shard in shards])
        epoch += 1


class PatternImages(Dataset):
    """The training split as {"image", "label"} samples (the dict layout MpDeviceLoader shards by key)."""

    def __init__(self, x: np.ndarray, y: np.ndarray) -> None:
        self.x, self.y = torch.from_numpy(x), torch.from_numpy(y)

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"image": self.x[i], "label": self.y[i]}


class GlobalBatchSampler(Sampler[list[int]]):
    """batch_sampler for the training DataLoader: one epoch (64 global batches) per pass, in order."""

    def __init__(self, n: int, seed: int) -> None:
        self.per_epoch = n // GLOBAL_BATCH
        self.batches = global_batches(n, seed)  # one stream for the whole run, epoch after epoch

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.per_epoch):
            yield next(self.batches).tolist()

    def __len__(self) -> int:
        return self.per_epoch


def to_sharded(a: np.ndarray, device: torch.device, mesh: xs.Mesh) -> torch.Tensor:
    """Move a batch to the device, sharded along dim 0 over the mesh's "data" axis."""
    t = torch.from_numpy(a).to(device)
    xs.mark_sharding(t, mesh, ("data",) + (None,) * (t.dim() - 1))
    return t


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device, mesh: xs.Mesh) -> tuple[int, float]:
    """Accuracy over the whole test split."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(x), EVAL_BATCH):
        xb = to_sharded(x[start : start + EVAL_BATCH], device, mesh)
        yb = to_sharded(y[start : start + EVAL_BATCH], device, mesh)
        correct += (model(xb).argmax(dim=-1) == yb).sum()
        torch_xla.sync()
    model.train()
    return len(x), correct.item() / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    xr.use_spmd()
    n_devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n_devices), (n_devices,), ("data",))
    torch.manual_seed(args.seed)  # the reference's rank-0 init (seed + 0), broadcast by DDP there
    device = torch_xla.device()
    xm.set_rng_state(args.seed, device=device)  # dropout on the XLA device draws from XLA's generator

    x_train, y_train, x_test, y_test = make_dataset()
    model = ConvNet(N_CLASSES).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)
    train_loader = pl.MpDeviceLoader(
        DataLoader(PatternImages(x_train, y_train), batch_sampler=GlobalBatchSampler(len(x_train), args.seed)),
        device,
        input_sharding={
            "image": xs.ShardingSpec(mesh, ("data", None, None, None)),
            "label": xs.ShardingSpec(mesh, ("data",)),
        },
    )

    model.train()
    step, acc = 0, float("nan")
    while step < args.steps:
        for batch in train_loader:  # one epoch; each next() cuts the previous step's graph
            step += 1
            loss = criterion(model(batch["image"]), batch["label"])
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
            optimizer.step()
            scheduler.step()

            if step % LOG_EVERY == 0:
                print(f"step {step} loss {loss.item():.6f}", flush=True)
            if step % args.eval_every == 0 or step == args.steps:
                items, acc = evaluate(model, x_test, y_test, device, mesh)
                print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)
            if step == args.steps:
                break

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
