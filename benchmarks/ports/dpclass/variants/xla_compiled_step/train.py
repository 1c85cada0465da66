"""Train the ConvNet on the synthetic pattern images (PyTorch/XLA port: one device, compiled step function).

Port notes: the reference runs DistributedDataParallel over 2 CPU processes (per-rank batch 32).
This port runs on one XLA device with the whole global batch of 64: with GroupNorm (per-sample
statistics) and equal shards, the mean loss over the 64 items and its gradient are exactly the
average of the two ranks' losses and gradients that DDP computes, so clipping the full-batch
gradient at norm 1.0 is clipping DDP's averaged gradient.

XLA habits of this port:
  * the training step is a plain function wrapped with torch_xla.compile(full_graph=True): the
    zero_grad/forward/backward/clip/Adam/LambdaLR of one step are traced into a single graph and
    executed when the function returns (full_graph makes any hidden host read inside it an error);
  * evaluation is another compiled function returning a device-side count of correct items, read
    once per evaluation;
  * the data pipeline is a torch DataLoader over the training tensors with a batch_sampler that
    yields the reference's global batches (both ranks' DistributedSamplers rebuilt with the same
    seed and set_epoch, rank 0's 32 items first), moved to the device before each step;
  * the loss is read to the host only on logging steps.
Run with PJRT_DEVICE=CPU.

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
from torch import nn
from torch.utils.data import DataLoader, Sampler, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from data import N_CLASSES, make_dataset
from model import ConvNet

WORLD_SIZE = 2  # the reference's ranks: the global batch is built from their two samplers
PER_RANK_BATCH = 32
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


class GlobalBatchSampler(Sampler[list[int]]):
    """batch_sampler for the training DataLoader: the reference's global batches as index lists."""

    def __init__(self, n: int, seed: int) -> None:
        self.n, self.seed = n, seed

    def __iter__(self) -> Iterator[list[int]]:
        for idx in global_batches(self.n, self.seed):
            yield idx.tolist()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)  # the reference's rank-0 init (seed + 0), broadcast by DDP there
    device = torch_xla.device()
    torch_xla.manual_seed(args.seed)  # dropout on the XLA device draws from XLA's generator

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    train_loader = DataLoader(train_set, batch_sampler=GlobalBatchSampler(len(train_set), args.seed))
    x_eval = [torch.from_numpy(x_test[s : s + EVAL_BATCH]).to(device) for s in range(0, len(x_test), EVAL_BATCH)]
    y_eval = [torch.from_numpy(y_test[s : s + EVAL_BATCH]).to(device) for s in range(0, len(y_test), EVAL_BATCH)]

    model = ConvNet(N_CLASSES).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)

    @torch_xla.compile(full_graph=True, name="train_step")
    def train_step(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        optimizer.zero_grad(set_to_none=True)
        loss = criterion(model(xb), yb)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        scheduler.step()
        return loss.detach()

    @torch_xla.compile(full_graph=True, name="eval_step")
    @torch.no_grad()
    def correct_count(xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return (model(xb).argmax(dim=-1) == yb).sum()

    def evaluate() -> tuple[int, float]:
        model.eval()
        correct = sum(correct_count(xb, yb) for xb, yb in zip(x_eval, y_eval))
        model.train()
        return len(x_test), correct.item() / len(x_test)

    model.train()
    acc = float("nan")
    batches = iter(train_loader)
    for step in range(1, args.steps + 1):
        xb, yb = next(batches)
        loss = train_step(xb.to(device), yb.to(device))

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate()
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
