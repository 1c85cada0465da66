"""Train the ConvNet on the synthetic pattern images (PyTorch/XLA port, one XLA device).

Port notes: the reference runs DistributedDataParallel over 2 CPU processes (per-rank batch 32).
Here one XLA device takes the whole global batch of 64: with GroupNorm (per-sample statistics)
and equal shards, the mean loss over the 64 items and its gradient are exactly the average of
the two ranks' losses and gradients that DDP computes, so clipping the full-batch gradient at
norm 1.0 is clipping DDP's averaged gradient. The global batches are the reference's: for every
epoch the DistributedSampler of each of the 2 ranks is rebuilt (same seed, set_epoch) and the two
32-item halves are concatenated (rank 0's first). Model, batches and optimizer state live on
torch_xla.device(); each split is packed on the host into one float32 array of rows (256 pixels,
then the label), so a batch is one host-to-device transfer, unpacked on the device (pixels
reshaped to (N, 1, 16, 16), the label column cast back to int64: class ids 0-7 are exact in
float32); torch_xla.sync() cuts one graph per step; host reads (.item()) only on
logging steps and at the end of an evaluation. Run with PJRT_DEVICE=CPU.

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
from torch import nn
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


N_PIXELS = 16 * 16


def pack(x: np.ndarray, y: np.ndarray) -> np.ndarray:
    """(N, 1, 16, 16) images and (N,) labels -> (N, 257) float32 rows: 256 pixels, then the label."""
    return np.concatenate([x.reshape(len(x), N_PIXELS), y.astype(np.float32)[:, None]], axis=1)


def unpack(rows: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(N, 257) rows on the device -> images (N, 1, 16, 16), labels (N,) int64."""
    return rows[:, :N_PIXELS].reshape(-1, 1, 16, 16), rows[:, N_PIXELS].long()


@torch.no_grad()
def evaluate(model: nn.Module, rows: np.ndarray, device: torch.device) -> tuple[int, float]:
    """Accuracy over the whole test split (packed rows)."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(rows), EVAL_BATCH):
        xb, yb = unpack(torch.from_numpy(rows[start : start + EVAL_BATCH]).to(device))
        correct += (model(xb).argmax(dim=-1) == yb).sum()
        torch_xla.sync()
    model.train()
    return len(rows), correct.item() / len(rows)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)  # the reference's rank-0 init (seed + 0), broadcast by DDP there
    device = torch_xla.device()
    xm.set_rng_state(args.seed, device=device)  # dropout on the XLA device draws from XLA's generator

    x_train, y_train, x_test, y_test = make_dataset()
    train_rows, test_rows = pack(x_train, y_train), pack(x_test, y_test)
    model = ConvNet(N_CLASSES).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)
    batches = global_batches(len(train_rows), args.seed)

    model.train()
    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches)
        xb, yb = unpack(torch.from_numpy(train_rows[idx]).to(device))

        loss = criterion(model(xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        optimizer.step()
        scheduler.step()
        torch_xla.sync()

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate(model, test_rows, device)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
