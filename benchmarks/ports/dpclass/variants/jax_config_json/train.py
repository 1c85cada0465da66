"""Train the ConvNet on the synthetic pattern images (JAX + Flax + Optax port, one device, config file).

Port notes: the reference runs PyTorch DDP over 2 processes (per-rank batch 32, gradients
averaged in backward). Here one jitted step takes the whole global batch of 64 on one device:
with GroupNorm (per-sample statistics) and equal shards, the mean loss over the 64 items and its
gradient are exactly the average over the two ranks that DDP computes. The optimizer is
optax.chain(clip_by_global_norm, add_decayed_weights, adam(schedule, b1, b2, eps)): clipping of
the averaged gradient first, then torch Adam's coupled L2 term, then Adam; the schedule is
evaluated at the update count before it is incremented (update i uses factor(i - 1)).

Configuration: the hyperparameters live in a TrainConfig dataclass. Its defaults are overridden
by configs/dpclass.json (next to this file, or --config PATH), which is overridden in turn by the
command-line flags that were actually given (--seed, --steps, --eval-every): defaults, then the
file, then the flags. Unknown keys in the file are an error.

Output (one line each, flushed):
  step {i} loss {x}                  every log_every steps (mean loss over the global batch)
  eval step {i} items {n} acc {x}    every eval_every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from data import N_CLASSES, make_dataset
from model import ConvNet

DEFAULT_CONFIG = Path(__file__).resolve().parent / "configs" / "dpclass.json"
GLOBAL_BATCH = 64  # the reference's 2 ranks x 32

Params = Any


@dataclasses.dataclass(frozen=True)
class ModelConfig:
    width: int = 16
    groups: int = 4
    dropout: float = 0.2


@dataclasses.dataclass(frozen=True)
class OptimConfig:
    lr: float = 1e-3
    b1: float = 0.9
    b2: float = 0.98
    eps: float = 1e-8
    weight_decay: float = 5e-4
    clip_norm: float = 1.0


@dataclasses.dataclass(frozen=True)
class ScheduleConfig:
    warmup_fraction: float = 0.05
    min_lr_ratio: float = 0.1


@dataclasses.dataclass(frozen=True)
class LossConfig:
    label_smoothing: float = 0.1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    seed: int = 0
    steps: int = 300
    eval_every: int = 100
    log_every: int = 10
    eval_batch: int = 256
    model: ModelConfig = dataclasses.field(default_factory=ModelConfig)
    optimizer: OptimConfig = dataclasses.field(default_factory=OptimConfig)
    schedule: ScheduleConfig = dataclasses.field(default_factory=ScheduleConfig)
    loss: LossConfig = dataclasses.field(default_factory=LossConfig)


def merge(cfg: Any, overrides: Mapping[str, Any]) -> Any:
    """cfg with the values in overrides (nested dicts into nested dataclasses); unknown keys are an error."""
    known = {f.name: f for f in dataclasses.fields(cfg)}
    changes = {}
    for key, value in overrides.items():
        if key not in known:
            raise KeyError(f"unknown config key {key!r} for {type(cfg).__name__}")
        current = getattr(cfg, key)
        changes[key] = merge(current, value) if dataclasses.is_dataclass(current) else type(current)(value)
    return dataclasses.replace(cfg, **changes)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", type=Path, default=DEFAULT_CONFIG)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> TrainConfig:
    """Defaults, then the JSON file, then the flags that were given."""
    cfg = TrainConfig()
    if args.config is not None and Path(args.config).exists():
        cfg = merge(cfg, json.loads(Path(args.config).read_text()))
    flags = {"seed": args.seed, "steps": args.steps, "eval_every": args.eval_every}
    return merge(cfg, {k: v for k, v in flags.items() if v is not None})


def make_schedule(cfg: ScheduleConfig, peak_lr: float, total_steps: int) -> Callable[[jax.Array], jax.Array]:
    """LR at update count c (from 0): linear warmup over a fraction of the steps, cosine to a fraction of the peak."""
    warmup = max(1, int(cfg.warmup_fraction * total_steps))

    def schedule(count: jax.Array) -> jax.Array:
        count = jnp.asarray(count, jnp.float32)
        progress = (count - warmup) / max(1, total_steps - warmup)
        cosine = cfg.min_lr_ratio + (1.0 - cfg.min_lr_ratio) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return peak_lr * jnp.where(count < warmup, (count + 1) / warmup, cosine)

    return schedule


def make_optimizer(cfg: OptimConfig, schedule: Callable) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(cfg.clip_norm),
        optax.add_decayed_weights(cfg.weight_decay),
        optax.adam(schedule, b1=cfg.b1, b2=cfg.b2, eps=cfg.eps),
    )


def global_batches(n: int, seed: int) -> Iterator[np.ndarray]:
    """Index arrays of 64 items: a fresh permutation every epoch, the last partial batch dropped."""
    epoch = 0
    while True:
        order = np.random.default_rng((seed, epoch)).permutation(n)
        for b in range(n // GLOBAL_BATCH):
            yield order[b * GLOBAL_BATCH : (b + 1) * GLOBAL_BATCH]
        epoch += 1


def make_train_step(model: ConvNet, tx: optax.GradientTransformation, label_smoothing: float = 0.1) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
        targets = optax.smooth_labels(jax.nn.one_hot(y, N_CLASSES), label_smoothing)
        return optax.softmax_cross_entropy(logits, targets).mean()

    @jax.jit
    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array, key: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def make_eval_batch(model: ConvNet) -> Callable:
    @jax.jit
    def eval_batch(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=False)
        return (logits.argmax(axis=-1) == y).sum()

    return eval_batch


def evaluate(eval_batch: Callable, params: Params, x: np.ndarray, y: np.ndarray, batch: int) -> tuple[int, float]:
    """Accuracy over the whole test split."""
    correct = jnp.zeros((), jnp.int32)
    for start in range(0, len(x), batch):
        correct = correct + eval_batch(params, x[start : start + batch], y[start : start + batch])
    return len(x), int(correct) / len(x)


def main(argv: list[str] | None = None) -> None:
    cfg = load_config(parse_args(argv))
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(cfg.seed))

    x_train, y_train, x_test, y_test = make_dataset()
    x_train, x_test = x_train.transpose(0, 2, 3, 1), x_test.transpose(0, 2, 3, 1)  # NCHW -> NHWC
    y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)

    model = ConvNet(N_CLASSES, width=cfg.model.width, groups=cfg.model.groups, dropout=cfg.model.dropout)
    tx = make_optimizer(cfg.optimizer, make_schedule(cfg.schedule, cfg.optimizer.lr, cfg.steps))
    params = model.init(init_key, jnp.zeros((1, *x_train.shape[1:])), train=False)["params"]
    opt_state = tx.init(params)
    train_step = make_train_step(model, tx, cfg.loss.label_smoothing)
    eval_batch = make_eval_batch(model)
    batches = global_batches(len(x_train), cfg.seed)

    acc = float("nan")
    for step in range(1, cfg.steps + 1):
        idx = next(batches)
        params, opt_state, loss = train_step(
            params, opt_state, x_train[idx], y_train[idx], jax.random.fold_in(dropout_key, step)
        )

        if step % cfg.log_every == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            items, acc = evaluate(eval_batch, params, x_test, y_test, cfg.eval_batch)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
