"""Train a tiny character-level GPT on the synthetic grammar corpus (PyTorch/XLA port, config-driven).

Port notes: the run's settings live in one TrainConfig dataclass instead of module constants.
They are resolved the way config-driven repos do it, later sources winning:

  1. the dataclass defaults (the original's constants),
  2. a JSON file (--config, default config.json next to this script), committed with the repo,
  3. the command-line flags that were actually given (every flag defaults to None, so a flag
     the user did not pass never shadows the file).

Unknown keys in the file are an error (a typo must not silently fall back to a default), and the
resolved config is printed once on stderr. Everything else is xla_single's loop: the model, every
batch and the optimiser state live on the XLA device (torch_xla.device()), torch_xla.sync() cuts
the graph once per training step and once per evaluation batch, the loss is read with .item()
every step. Run with PJRT_DEVICE=CPU (or TPU / CUDA).

Habits kept from nanoGPT-like repos:
  - batches are random windows whose offsets come from numpy's global RNG, seeded from --seed;
  - the training loss is read back with .item() and printed EVERY step;
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
import dataclasses
import json
import math
import os
import sys
from dataclasses import dataclass

import numpy as np
import torch
import torch_xla

from data import make_dataset
from model import GPT, GPTConfig

DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json")


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1337
    steps: int = 300
    eval_every: int = 100
    block_size: int = 32
    batch_size: int = 16
    eval_batch: int = 32
    eval_iters: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 0.5
    warmup_fraction: float = 0.1
    min_lr_ratio: float = 0.1
    device: str = "xla"


BLOCK_SIZE = TrainConfig.block_size  # the model's context length, for code that builds the model by hand


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="JSON file of TrainConfig fields")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    p.add_argument("--device", default=None, help="'xla' (torch_xla.device()) or a torch device")
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then the JSON file, then the flags that were given."""
    cfg = TrainConfig()
    known = {f.name for f in dataclasses.fields(TrainConfig)}
    if args.config:
        with open(args.config) as fh:
            from_file = json.load(fh)
        unknown = sorted(set(from_file) - known)
        if unknown:
            raise SystemExit(f"{args.config}: unknown config keys {unknown}")
        cfg = dataclasses.replace(cfg, **from_file)
    flags = {k: v for k, v in vars(args).items() if k != "config" and v is not None}
    return dataclasses.replace(cfg, **flags)


def get_lr(it: int, cfg: TrainConfig) -> float:
    """nanoGPT's schedule for update `it` (from 0): linear warmup, then cosine decay to min_lr_ratio * lr."""
    warmup = max(1, int(cfg.warmup_fraction * cfg.steps))
    min_lr = cfg.min_lr_ratio * cfg.lr
    if it < warmup:
        return cfg.lr * (it + 1) / (warmup + 1)
    ratio = (it - warmup) / max(1, cfg.steps - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (cfg.lr - min_lr)


def get_batch(data: np.ndarray, batch_size: int, block_size: int = BLOCK_SIZE) -> tuple[np.ndarray, np.ndarray]:
    """Random windows: offsets from numpy's global RNG (seeded in main)."""
    ix = np.random.randint(0, len(data) - block_size, size=batch_size)
    x = np.stack([data[i : i + block_size] for i in ix])
    y = np.stack([data[i + 1 : i + 1 + block_size] for i in ix])
    return x, y


def eval_offsets(data: np.ndarray, cfg: TrainConfig) -> np.ndarray:
    """eval_iters * eval_batch evenly spaced window offsets into the validation text."""
    return np.linspace(0, len(data) - cfg.block_size - 1, cfg.eval_iters * cfg.eval_batch).astype(np.int64)


@torch.no_grad()
def evaluate(model: GPT, data: np.ndarray, offsets: np.ndarray, device: torch.device,
             cfg: TrainConfig) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (eval_iters batches of eval_batch)."""
    model.eval()
    losses = []
    T = cfg.block_size
    for k in range(cfg.eval_iters):
        ix = offsets[k * cfg.eval_batch : (k + 1) * cfg.eval_batch]
        x = torch.from_numpy(np.stack([data[i : i + T] for i in ix])).to(device)
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + T] for i in ix])).to(device)
        _, loss = model(x, y)
        losses.append(loss)
        torch_xla.sync()
    model.train()
    return cfg.eval_iters * cfg.eval_batch, torch.stack(losses).mean().item()


def main(argv: list[str] | None = None) -> None:
    cfg = load_config(parse_args(argv))
    print(f"config: {json.dumps(dataclasses.asdict(cfg), sort_keys=True)}", file=sys.stderr, flush=True)
    np.random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)
    device = torch_xla.device() if cfg.device == "xla" else torch.device(cfg.device)

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data, cfg)
    model = GPT(GPTConfig(vocab_size=len(vocab), block_size=cfg.block_size)).to(device)
    optimizer = model.configure_optimizers(cfg.weight_decay, cfg.lr, (cfg.beta1, cfg.beta2), cfg.eps)

    model.train()
    val_loss = float("nan")
    for it in range(cfg.steps):
        lr = get_lr(it, cfg)
        for group in optimizer.param_groups:
            group["lr"] = lr
        xb, yb = get_batch(train_data, cfg.batch_size, cfg.block_size)
        x, y = torch.from_numpy(xb).to(device), torch.from_numpy(yb).to(device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        optimizer.step()
        torch_xla.sync()

        step = it + 1
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            n, val_loss = evaluate(model, val_data, offsets, device, cfg)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    print(f"metric val_loss={val_loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
