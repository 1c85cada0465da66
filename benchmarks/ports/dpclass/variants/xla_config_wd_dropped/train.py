"""Train the ConvNet on the synthetic pattern images (PyTorch/XLA port, one XLA device, YAML config).

Port notes: the reference runs DistributedDataParallel over 2 CPU processes (per-rank batch 32).
Here one XLA device takes the whole global batch of 64: with GroupNorm (per-sample statistics)
and equal shards, the mean loss over the 64 items and its gradient are exactly the average of
the two ranks' losses and gradients that DDP computes, so clipping the full-batch gradient at
norm 1.0 is clipping DDP's averaged gradient. The global batches are the reference's: for every
epoch the DistributedSampler of each of the 2 ranks is rebuilt (same seed, set_epoch) and the two
32-item halves are concatenated (rank 0's first). Model, batches and optimizer state live on
torch_xla.device(); torch_xla.sync() cuts one graph per step; host reads (.item()) only on
logging steps and at the end of an evaluation. Run with PJRT_DEVICE=CPU.

Configuration: the hyperparameters live in a TrainConfig dataclass (sections data, model,
optimizer, schedule, loss). Its defaults are overridden by configs/train.yaml (next to this
file, or --config PATH), which is overridden in turn by the command-line flags that were given
(--seed, --steps, --eval-every): defaults, then the file, then the flags. Keys a section does
not know are skipped, so a config written for a newer version still loads.

Output (one line each, flushed):
  step {i} loss {x}                  every log_every steps (mean loss over the global batch)
  eval step {i} items {n} acc {x}    every eval_every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import dataclasses
import math
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
import yaml
from torch import nn
from torch.utils.data.distributed import DistributedSampler

from data import N_CLASSES, make_dataset
from model import ConvNet

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "train.yaml"
WORLD_SIZE = 2  # the reference's ranks: the global batch is built from their two samplers
PER_RANK_BATCH = 32


@dataclasses.dataclass
class DataConfig:
    eval_batch: int = 512


@dataclasses.dataclass
class ModelConfig:
    width: int = 16
    groups: int = 4
    dropout: float = 0.2


@dataclasses.dataclass
class OptimConfig:
    lr: float = 1e-3
    betas: tuple[float, float] = (0.9, 0.98)
    eps: float = 1e-8
    wd: float = 1e-2
    clip_norm: float = 1.0


@dataclasses.dataclass
class ScheduleConfig:
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.1


@dataclasses.dataclass
class LossConfig:
    label_smoothing: float = 0.1


@dataclasses.dataclass
class TrainConfig:
    seed: int = 0
    steps: int = 300
    eval_every: int = 100
    log_every: int = 10
    data: DataConfig = dataclasses.field(default_factory=DataConfig)
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)


def update(cfg: Any, values: Mapping[str, Any]) -> Any:
    """Set the fields of cfg found in values (recursing into sections); keys cfg does not know are skipped."""
    for f in dataclasses.fields(cfg):
        if f.name not in values:
            continue
        current = getattr(cfg, f.name)
        if dataclasses.is_dataclass(current):
            update(current, values[f.name])
        else:
            setattr(cfg, f.name, tuple(values[f.name]) if isinstance(current, tuple) else type(current)(values[f.name]))
    return cfg


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then the YAML file, then the flags that were given."""
    cfg = TrainConfig()
    if args.config is not None and Path(args.config).exists():
        update(cfg, yaml.safe_load(Path(args.config).read_text()) or {})
    flags = {"seed": args.seed, "steps": args.steps, "eval_every": args.eval_every}
    return update(cfg, {k: v for k, v in flags.items() if v is not None})


def lr_factor(step: int, total_steps: int, cfg: ScheduleConfig) -> float:
    """Linear warmup over a fraction of the steps, then cosine decay to min_lr_ratio; step counts from 0."""
    warmup = max(1, int(cfg.warmup_fraction * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


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
def evaluate(model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device, batch: int) -> tuple[int, float]:
    """Accuracy over the whole test split."""
    model.eval()
    correct = torch.zeros((), dtype=torch.long, device=device)
    for start in range(0, len(x), batch):
        xb = torch.from_numpy(x[start : start + batch]).to(device)
        yb = torch.from_numpy(y[start : start + batch]).to(device)
        correct += (model(xb).argmax(dim=-1) == yb).sum()
        torch_xla.sync()
    model.train()
    return len(x), correct.item() / len(x)


def main(argv: list[str] | None = None) -> None:
    cfg = load_config(parse_args(argv))
    torch.manual_seed(cfg.seed)  # the reference's rank-0 init (seed + 0), broadcast by DDP there
    device = torch_xla.device()
    xm.set_rng_state(cfg.seed, device=device)  # dropout on the XLA device draws from XLA's generator

    x_train, y_train, x_test, y_test = make_dataset()
    model = ConvNet(N_CLASSES, width=cfg.model.width, groups=cfg.model.groups, dropout=cfg.model.dropout).to(device)
    opt = cfg.optimizer
    optimizer = torch.optim.Adam(model.parameters(), lr=opt.lr, betas=opt.betas, eps=opt.eps, weight_decay=opt.wd)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, cfg.steps, cfg.schedule))
    criterion = nn.CrossEntropyLoss(label_smoothing=cfg.loss.label_smoothing)
    batches = global_batches(len(x_train), cfg.seed)

    model.train()
    acc = float("nan")
    for step in range(1, cfg.steps + 1):
        idx = next(batches)
        xb = torch.from_numpy(x_train[idx]).to(device)
        yb = torch.from_numpy(y_train[idx]).to(device)

        loss = criterion(model(xb), yb)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        nn.utils.clip_grad_norm_(model.parameters(), opt.clip_norm)
        optimizer.step()
        scheduler.step()
        torch_xla.sync()

        if step % cfg.log_every == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            items, acc = evaluate(model, x_test, y_test, device, cfg.data.eval_batch)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
