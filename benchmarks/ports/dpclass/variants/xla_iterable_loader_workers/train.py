"""Train the ConvNet on the synthetic pattern images (PyTorch/XLA port, one device, loader workers + MpDeviceLoader).

Port notes: the reference runs DistributedDataParallel over 2 CPU processes (per-rank batch 32).
Here one XLA device takes the whole global batch of 64: with GroupNorm (per-sample statistics)
and equal shards, the mean loss over the 64 items and its gradient are exactly the average of
the two ranks' losses and gradients that DDP computes, so clipping the full-batch gradient at
norm 1.0 is clipping DDP's averaged gradient. The global batches are the reference's: for every
epoch the DistributedSampler of each of the 2 ranks is rebuilt (same seed, set_epoch) and the two
32-item halves are concatenated (rank 0's first). Model, batches and optimizer state live on
torch_xla.device(). Input pipeline: torch_xla's own, with host-side collation in loader
workers: an IterableDataset streams the epoch's global batches (the (x, y) tensors of each index
array, gathered on the host), a DataLoader with 2 worker processes (batch_size=None: the stream's
items are already batches) runs it off the main process, and
torch_xla.distributed.parallel_loader.MpDeviceLoader copies the batches to the device ahead of the
step and cuts the step's graph (torch_xla.sync) when the next batch is taken. Host reads (.item())
only on logging steps and at the end of an evaluation. Run with PJRT_DEVICE=CPU.

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps (mean loss over the global batch)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import itertools
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
from torch import nn
from torch.utils.data import DataLoader, IterableDataset
from torch.utils.data.distributed import DistributedSampler

from data import N_CLASSES, make_dataset
from model import ConvNet

WORLD_SIZE = 2  # the reference's ranks: the global batch is built from their two samplers
PER_RANK_BATCH = 32
GLOBAL_BATCH = WORLD_SIZE * PER_RANK_BATCH
EVAL_BATCH = 512
LOADER_WORKERS = 2  # host-side gathering and collation off the training process
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


class GlobalBatchStream(IterableDataset):
    """One epoch of global batches per pass: (x, y) tensors of each of global_batches' index arrays."""

    def __init__(self, x: np.ndarray, y: np.ndarray, seed: int) -> None:
        self.x, self.y, self.seed, self.epoch = x, y, seed, 0
        self.per_epoch = len(x) // GLOBAL_BATCH

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        start = self.epoch * self.per_epoch
        for idx in itertools.islice(global_batches(len(self.x), self.seed), start, start + self.per_epoch):
            yield torch.from_numpy(self.x[idx]), torch.from_numpy(self.y[idx])


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device) -> tuple[int, float]:
    """Accuracy over the whole test split."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(x), EVAL_BATCH):
        xb = torch.from_numpy(x[start : start + EVAL_BATCH]).to(device)
        yb = torch.from_numpy(y[start : start + EVAL_BATCH]).to(device)
        correct += (model(xb).argmax(dim=-1) == yb).sum()
        torch_xla.sync()
    model.train()
    return len(x), correct.item() / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)  # the reference's rank-0 init (seed + 0), broadcast by DDP there
    device = torch_xla.device()
    xm.set_rng_state(args.seed, device=device)  # dropout on the XLA device draws from XLA's generator

    x_train, y_train, x_test, y_test = make_dataset()
    model = ConvNet(N_CLASSES).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)
    stream = GlobalBatchStream(x_train, y_train, args.seed)
    cpu_loader = DataLoader(stream, batch_size=None, num_workers=LOADER_WORKERS)  # items are whole batches
    train_loader = pl.MpDeviceLoader(cpu_loader, device)  # transfer ahead of the step

    model.train()
    step, epoch, acc = 0, 0, float("nan")
    while step < args.steps:
        stream.set_epoch(epoch)  # read by the workers, which start at every pass
        for xb, yb in train_loader:  # one epoch; each next() cuts the previous step's graph
            step += 1
            loss = criterion(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
            optimizer.step()
            scheduler.step()

            if step % LOG_EVERY == 0:
                print(f"step {step} loss {loss.item():.6f}", flush=True)
            if step % args.eval_every == 0 or step == args.steps:
                items, acc = evaluate(model, x_test, y_test, device)
                print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)
            if step == args.steps:
                break
        epoch += 1

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
