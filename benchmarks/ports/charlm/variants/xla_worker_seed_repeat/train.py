"""Train a tiny character-level GPT on the synthetic grammar corpus (PyTorch/XLA port,
torch_xla's loader and optimizer-step habits).

Port notes:
  - the random training windows come from an IterableDataset that draws their offsets from
    numpy's global RNG, wrapped in a DataLoader with NUM_WORKERS worker processes (the window
    gathering off the training process) and torch_xla's MpDeviceLoader, which moves each batch
    to the XLA device in a background thread and cuts the graph (torch_xla.sync) once per batch.
    The dataset splits the steps over the workers (get_worker_info: worker k makes batches
    k, k + NUM_WORKERS, ...; the DataLoader interleaves them round-robin), and every worker is
    seeded from --seed by seed_worker (random, numpy, torch), the reproducibility recipe, so a
    run is the same whatever the worker timing;
  - the update goes through xm.optimizer_step(optimizer), which all-reduces the gradients
    over the replicas (a no-op on one device) and steps the optimiser; clipping at global
    norm 0.5 comes before it, as in the original;
  - the loss is logged from a step closure (xm.add_step_closure), which reads it with .item()
    once the step's graph has run: one read per step, as in the original;
  - the learning rate set in the param groups is a Python float, passed to the graph as data;
  - evaluation: fixed shapes, torch_xla.sync() per batch, one .item() at the end.
Run with PJRT_DEVICE=CPU (or TPU / CUDA).

Habits kept from nanoGPT-like repos:
  - AdamW with two parameter groups (weight decay on every 2-D weight, embeddings included;
    none on biases and LayerNorm), betas (0.9, 0.95), gradient clipping at global norm 0.5;
  - linear warmup over the first 10% of the steps, then cosine decay to a tenth of the peak;
  - a periodic evaluation over a fixed number of batches of the held-out split, and a final one.

Output (one line each, flushed):
  step {i} loss {loss}                        every step (i counts from 1, after the update)
  eval step {i} items {n} loss {loss}         every --eval-every steps and after the last step
  metric val_loss={loss}                      once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
import functools
import math
import random
from collections.abc import Iterator

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
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


class RandomWindows(torch.utils.data.IterableDataset):
    """`steps` batches of random windows; offsets from numpy's global RNG (seeded in main)."""

    def __init__(self, data: np.ndarray, batch_size: int, steps: int) -> None:
        self.data, self.batch_size, self.steps = data, batch_size, steps

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        info = torch.utils.data.get_worker_info()
        n_workers, worker = (info.num_workers, info.id) if info is not None else (1, 0)
        for _ in range(worker, self.steps, n_workers):  # this worker's share of the steps
            ix = np.random.randint(0, len(self.data) - BLOCK_SIZE, size=self.batch_size)
            x = np.stack([self.data[i : i + BLOCK_SIZE] for i in ix])
            y = np.stack([self.data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
            yield torch.from_numpy(x), torch.from_numpy(y)


def seed_worker(worker_id: int, seed: int) -> None:
    """DataLoader worker_init_fn: seed every RNG a worker may use, so runs are reproducible."""
    random.seed(seed)
    np.random.seed(seed)
    torch.manual_seed(seed)


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


def log_step(step: int, loss: torch.Tensor) -> None:
    print(f"step {step} loss {loss.item():.6f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch_xla.device()

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data)
    cfg = GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE)
    model = GPT(cfg).to(device)
    optimizer = model.configure_optimizers(WEIGHT_DECAY, args.lr, BETAS, EPS)
    loader = torch.utils.data.DataLoader(RandomWindows(train_data, BATCH_SIZE, args.steps), batch_size=None,
                                         num_workers=NUM_WORKERS,
                                         worker_init_fn=functools.partial(seed_worker, seed=args.seed))
    device_loader = pl.MpDeviceLoader(loader, device)

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
        xm.optimizer_step(optimizer)

        step = it + 1
        xm.add_step_closure(log_step, args=(step, loss))
        if step % args.eval_every == 0 or step == args.steps:
            n, val_loss = evaluate(model, val_data, offsets, device)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    print(f"metric val_loss={val_loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
