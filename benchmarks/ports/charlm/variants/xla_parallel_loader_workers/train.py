"""Train a tiny character-level GPT on the synthetic grammar corpus (PyTorch/XLA port,
torch_xla's input pipeline).

Port notes:
  - the input pipeline is a torch DataLoader with worker processes feeding torch_xla's
    ParallelLoader: a map-style Dataset (Windows) returns the window at an offset and its
    targets; a batch sampler (RandomOffsetBatches), which the DataLoader iterates in the main
    process, draws each step's BATCH_SIZE offsets from numpy's global RNG (seeded from --seed,
    the same np.random.randint call as the original's get_batch), and NUM_WORKERS worker
    processes gather and collate the windows of the index lists they are sent. The DataLoader
    returns the batches in the sampler's order whatever worker finishes first, so step `it`
    trains on the original's batch `it`. The workers' own RNG seeding is irrelevant: they draw
    nothing;
  - pl.ParallelLoader(loader, [device]).per_device_loader(device) copies each batch to the XLA
    device on a background thread ahead of the step and cuts the graph (torch_xla.sync) when
    the next batch is taken;
  - the model and the optimiser state live on the XLA device; the loss is read with .item()
    every step for the log line, as in the original; the learning rate set in the param groups
    is a Python float, passed to the graph as data; evaluation has fixed shapes, one
    torch_xla.sync() per batch. Run with PJRT_DEVICE=CPU (or TPU / CUDA).

Habits kept from nanoGPT-like repos:
  - AdamW with two parameter groups (weight decay on every 2-D weight, embeddings included;
    none on biases and LayerNorm), betas (0.9, 0.95), gradient clipping at global norm 0.5;
  - the learning rate is set by hand in each param group every step: linear warmup over the
    first 10% of the steps, then cosine decay to a tenth of the peak;
  - a periodic evaluation over a fixed number of batches of the held-out split, and a final one.

Output (one line each, flushed):
  step {i} loss {loss}                        every step (i counts from 1, after the update)
  eval step {i} items {n} loss {loss}         every --eval-every steps and after the last step
  metric val_loss={loss}                      once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.parallel_loader as pl

from data import make_dataset
from model import GPT, GPTConfig

BLOCK_SIZE = 32
BATCH_SIZE = 16
EVAL_BATCH = 32
EVAL_ITERS = 8
NUM_WORKERS = 2
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
EPS = 1e-8
GRAD_CLIP = 0.5
WARMUP_FRACTION = 0.1
MIN_LR_RATIO = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--device", default="xla", help="'xla' (torch_xla.device()) or a torch device")
    return p.parse_args(argv)


def get_lr(it: int, total: int, peak: float) -> float:
    """nanoGPT's schedule for update `it` (from 0): linear warmup, then cosine decay to MIN_LR_RATIO * peak."""
    warmup = max(1, int(WARMUP_FRACTION * total))
    min_lr = MIN_LR_RATIO * peak
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    ratio = (it - warmup) / max(1, total - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (peak - min_lr)


class Windows(torch.utils.data.Dataset):
    """Item `offset`: the BLOCK_SIZE window at that offset and its targets (the window at offset + 1)."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data

    def __len__(self) -> int:
        return len(self.data) - BLOCK_SIZE

    def __getitem__(self, offset: int) -> tuple[torch.Tensor, torch.Tensor]:
        x = torch.from_numpy(self.data[offset : offset + BLOCK_SIZE].copy())
        y = torch.from_numpy(self.data[offset + 1 : offset + 1 + BLOCK_SIZE].copy())
        return x, y


class RandomOffsetBatches(torch.utils.data.Sampler):
    """`steps` lists of `batch_size` offsets, drawn from numpy's global RNG (seeded in main) as the
    original's get_batch draws them. A DataLoader iterates its batch sampler in the main process."""

    def __init__(self, n_windows: int, batch_size: int, steps: int) -> None:
        self.n_windows, self.batch_size, self.steps = n_windows, batch_size, steps

    def __iter__(self) -> Iterator[list[int]]:
        for _ in range(self.steps):
            yield np.random.randint(0, self.n_windows, size=self.batch_size).tolist()

    def __len__(self) -> int:
        return self.steps


def make_train_loader(data: np.ndarray, steps: int) -> torch.utils.data.DataLoader:
    """The training batches, in the original's order, gathered by NUM_WORKERS worker processes."""
    dataset = Windows(data)
    return torch.utils.data.DataLoader(dataset, batch_sampler=RandomOffsetBatches(len(dataset), BATCH_SIZE, steps),
                                       num_workers=NUM_WORKERS, prefetch_factor=2)


def eval_offsets(data: np.ndarray) -> np.ndarray:
    """EVAL_ITERS * EVAL_BATCH evenly spaced window offsets into the validation text."""
    return np.linspace(0, len(data) - BLOCK_SIZE - 1, EVAL_ITERS * EVAL_BATCH).astype(np.int64)


@torch.no_grad()
def evaluate(model: GPT, data: np.ndarray, offsets: np.ndarray, device: torch.device) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (EVAL_ITERS batches of EVAL_BATCH)."""
    model.eval()
    losses = []
    for k in range(EVAL_ITERS):
        ix = offsets[k * EVAL_BATCH : (k + 1) * EVAL_BATCH]
        x = torch.from_numpy(np.stack([data[i : i + BLOCK_SIZE] for i in ix])).to(device)
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])).to(device)
        _, loss = model(x, y)
        losses.append(loss)
        torch_xla.sync()
    model.train()
    return EVAL_ITERS * EVAL_BATCH, torch.stack(losses).mean().item()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch_xla.device() if args.device == "xla" else torch.device(args.device)

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data)
    cfg = GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE)
    model = GPT(cfg).to(device)
    optimizer = model.configure_optimizers(WEIGHT_DECAY, args.lr, BETAS, EPS)

    loader = make_train_loader(train_data, args.steps)
    device_loader = pl.ParallelLoader(loader, [device]).per_device_loader(device)

    model.train()
    val_loss = float("nan")
    for it, (x, y) in enumerate(device_loader):
        lr = get_lr(it, args.steps, args.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        torch_xla.sync()

        step = it + 1
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            n, val_loss = evaluate(model, val_data, offsets, device)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    print(f"metric val_loss={val_loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
