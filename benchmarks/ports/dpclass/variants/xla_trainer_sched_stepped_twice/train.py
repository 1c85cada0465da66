"""Train the ConvNet on the synthetic pattern images (PyTorch/XLA port, one XLA device).

Port notes: the reference runs DistributedDataParallel over 2 CPU processes (per-rank batch 32).
Here one XLA device takes the whole global batch of 64: with GroupNorm (per-sample statistics)
and equal shards, the mean loss over the 64 items and its gradient are exactly the average of
the two ranks' losses and gradients that DDP computes, so clipping the full-batch gradient at
norm 1.0 is clipping DDP's averaged gradient. The global batches are the reference's: for every
epoch the DistributedSampler of each of the 2 ranks is rebuilt (same seed, set_epoch) and the two
32-item halves are concatenated (rank 0's first). Model, batches and optimizer state live on
torch_xla.device(). The loop is a small Trainer grown by the port: fit() runs forward, backward,
the hooks, xm.optimizer_step (reduce_gradients, a no-op on one device, then optimizer.step()),
the LR scheduler it was given (stepped after the optimizer, torch's order) and xm.mark_step()
(one graph per step); clipping, logging and evaluation are callbacks (on_before_optimizer_step,
on_step_end, on_train_end) reading a metrics collection.
Host reads (.item()) only on logging steps and at the end of an evaluation. Run with
PJRT_DEVICE=CPU.

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


@torch.no_grad()
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device) -> tuple[int, float]:
    """Accuracy over the whole test split."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(x), EVAL_BATCH):
        xb = torch.from_numpy(x[start : start + EVAL_BATCH]).to(device)
        yb = torch.from_numpy(y[start : start + EVAL_BATCH]).to(device)
        correct += (model(xb).argmax(dim=-1) == yb).sum()
        xm.mark_step()
    model.train()
    return len(x), correct.item() / len(x)


class Callback:
    """Hooks the Trainer calls; every one gets the trainer (model, optimizer, step, metrics)."""

    def on_train_begin(self, trainer: Trainer) -> None: ...
    def on_before_optimizer_step(self, trainer: Trainer) -> None: ...
    def on_step_end(self, trainer: Trainer) -> None: ...
    def on_train_end(self, trainer: Trainer) -> None: ...


class Metrics:
    """The trainer's metrics collection: the latest value of each named metric (device tensors allowed)."""

    def __init__(self) -> None:
        self.values: dict[str, torch.Tensor | float] = {}

    def update(self, **values: torch.Tensor | float) -> None:
        self.values.update(values)

    def read(self, name: str) -> float:
        v = self.values[name]
        return v.item() if isinstance(v, torch.Tensor) else float(v)


class Trainer:
    def __init__(self, model: nn.Module, optimizer: torch.optim.Optimizer, criterion: nn.Module,
                 device: torch.device, callbacks: list[Callback],
                 scheduler: torch.optim.lr_scheduler.LRScheduler | None = None) -> None:
        self.model, self.optimizer, self.criterion, self.device = model, optimizer, criterion, device
        self.scheduler = scheduler
        self.callbacks = callbacks
        self.metrics = Metrics()
        self.step = 0

    def _hook(self, name: str) -> None:
        for cb in self.callbacks:
            getattr(cb, name)(self)

    def training_step(self, idx: np.ndarray, x: np.ndarray, y: np.ndarray) -> torch.Tensor:
        xb = torch.from_numpy(x[idx]).to(self.device)
        yb = torch.from_numpy(y[idx]).to(self.device)
        return self.criterion(self.model(xb), yb)

    def fit(self, batches: Iterator[np.ndarray], x: np.ndarray, y: np.ndarray, num_steps: int) -> None:
        self.model.train()
        self._hook("on_train_begin")
        while self.step < num_steps:
            self.step += 1
            loss = self.training_step(next(batches), x, y)
            self.optimizer.zero_grad(set_to_none=True)
            loss.backward()
            self._hook("on_before_optimizer_step")
            xm.optimizer_step(self.optimizer)
            if self.scheduler is not None:
                self.scheduler.step()
            xm.mark_step()
            self.metrics.update(loss=loss.detach())
            self._hook("on_step_end")
        self._hook("on_train_end")


class GradClip(Callback):
    def __init__(self, max_norm: float) -> None:
        self.max_norm = max_norm

    def on_before_optimizer_step(self, trainer: Trainer) -> None:
        nn.utils.clip_grad_norm_(trainer.model.parameters(), self.max_norm)


class LRSchedule(Callback):
    """Steps the LR scheduler after every optimizer step (torch's order)."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        self.scheduler = scheduler

    def on_step_end(self, trainer: Trainer) -> None:
        self.scheduler.step()


class LossLogger(Callback):
    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.step % self.every == 0:
            print(f"step {trainer.step} loss {trainer.metrics.read('loss'):.6f}", flush=True)


class Evaluator(Callback):
    """Evaluates every `every` steps and at the last step; the result goes into the metrics as test_acc."""

    def __init__(self, every: int, num_steps: int, x: np.ndarray, y: np.ndarray) -> None:
        self.every, self.num_steps, self.x, self.y = every, num_steps, x, y

    def on_step_end(self, trainer: Trainer) -> None:
        if trainer.step % self.every == 0 or trainer.step == self.num_steps:
            items, acc = evaluate(trainer.model, self.x, self.y, trainer.device)
            trainer.metrics.update(test_acc=acc)
            print(f"eval step {trainer.step} items {items} acc {acc:.6f}", flush=True)

    def on_train_end(self, trainer: Trainer) -> None:
        print(f"metric test_acc={trainer.metrics.read('test_acc'):.6f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)  # the reference's rank-0 init (seed + 0), broadcast by DDP there
    device = torch_xla.device()
    xm.set_rng_state(args.seed, device=device)  # dropout on the XLA device draws from XLA's generator

    x_train, y_train, x_test, y_test = make_dataset()
    model = ConvNet(N_CLASSES).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))
    callbacks: list[Callback] = [
        GradClip(CLIP_NORM),
        LRSchedule(scheduler),
        LossLogger(LOG_EVERY),
        Evaluator(args.eval_every, args.steps, x_test, y_test),
    ]
    trainer = Trainer(model, optimizer, nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING), device, callbacks,
                      scheduler=scheduler)
    trainer.fit(global_batches(len(x_train), args.seed), x_train, y_train, args.steps)


if __name__ == "__main__":
    main()
