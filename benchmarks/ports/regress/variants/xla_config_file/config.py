"""Run configuration: dataclass defaults, then a JSON file, then command-line flags.

The defaults below are the library's generic ones; the program's own values live in
configs/regress.json. The file is nested by section ({"optim": {"lr": ...}}); every key
must name a TrainConfig field (an unknown key is an error, not silently ignored). Flags
override the file only when they are given on the command line (argparse.SUPPRESS
defaults), so a flag that is not passed never clobbers a value from the file.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path
from typing import Any

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "regress.json"


@dataclasses.dataclass
class TrainConfig:
    # model
    hidden: int = 128
    # data
    batch_size: int = 256
    eval_batch: int = 512
    # optimiser (torch.optim.SGD)
    lr: float = 0.1
    momentum: float = 0.0
    weight_decay: float = 0.0
    # schedule (MultiStepLR, milestones as fractions of steps)
    milestones: tuple[float, ...] = (0.5, 0.75)
    gamma: float = 0.1
    # loop
    steps: int = 1000
    eval_every: int = 500
    log_every: int = 25
    seed: int = 0
    device: str = "xla"


FIELDS = {f.name for f in dataclasses.fields(TrainConfig)}


def _flatten(tree: dict[str, Any]) -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for section, values in tree.items():
        if section.startswith("_"):
            continue
        if not isinstance(values, dict):
            raise ValueError(f"config section {section!r} must be a table")
        for key, value in values.items():
            if key not in FIELDS:
                raise ValueError(f"unknown config key {section}.{key}")
            flat[key] = value
    return flat


def load_config(path: str | Path | None, overrides: dict[str, Any]) -> TrainConfig:
    """defaults -> file -> overrides (the flags that were given)."""
    cfg = TrainConfig()
    if path is not None:
        with open(path) as f:
            values = _flatten(json.load(f))
        if "milestones" in values:
            values["milestones"] = tuple(values["milestones"])
        cfg = dataclasses.replace(cfg, **values)
    unknown = set(overrides) - FIELDS
    if unknown:
        raise ValueError(f"unknown overrides {sorted(unknown)}")
    return dataclasses.replace(cfg, **overrides)


def build_parser(description: str | None = None) -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=description, formatter_class=argparse.RawTextHelpFormatter,
                                argument_default=argparse.SUPPRESS)
    p.add_argument("--config", default=str(DEFAULT_CONFIG), help="JSON config (default: configs/regress.json)")
    p.add_argument("--steps", type=int)
    p.add_argument("--eval-every", type=int)
    p.add_argument("--batch-size", type=int)
    p.add_argument("--lr", type=float)
    p.add_argument("--hidden", type=int)
    p.add_argument("--device", help="'xla' (torch_xla.device()) or a torch device")
    return p
