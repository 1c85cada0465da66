"""Run configuration: TrainConfig defaults <- configs/regress.json <- command-line flags.

Every flag takes its default from the dataclass, so `--help` shows the effective
defaults; a flag's value replaces the file's (flags win, as in the larger repos).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

import jax

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "regress.json"


@dataclasses.dataclass
class TrainConfig:
    hidden: int = 64
    batch_size: int = 128
    eval_batch: int = 256
    lr: float = 0.1
    momentum: float = 0.9
    weight_decay: float = 5e-4
    milestones: tuple[float, ...] = (0.5, 0.75)  # fractions of steps
    gamma: float = 0.1
    steps: int = 1600
    eval_every: int = 400
    log_every: int = 25
    seed: int = 1234
    device: str = dataclasses.field(default_factory=jax.default_backend)


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    d = TrainConfig()
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="JSON file with TrainConfig fields")
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--eval-every", type=int, default=d.eval_every)
    p.add_argument("--batch-size", type=int, default=d.batch_size)
    p.add_argument("--lr", type=float, default=d.lr)
    p.add_argument("--hidden", type=int, default=d.hidden)
    p.add_argument("--device", default=d.device, help="JAX platform: cpu, gpu or tpu")
    return p


def load_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then the file, then the flags."""
    cfg = TrainConfig()
    if args.config:
        with open(args.config) as f:
            values: dict[str, Any] = json.load(f)
        values = {k: v for k, v in values.items() if not k.startswith("_")}
        if "milestones" in values:
            values["milestones"] = tuple(values["milestones"])
        cfg = dataclasses.replace(cfg, **values)
    flags = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    return dataclasses.replace(cfg, **flags)
