"""Train the tiny character GPT on the synthetic grammar corpus (JAX + Flax + Optax port).

Port notes:
  - config-driven: the hyperparameters live in a TrainConfig dataclass (its defaults are
    nanoGPT's train.py defaults), overridden by the committed JSON file (--config, default
    config.json beside this script), then by the command-line flags actually given (flags
    default to None). Keys of the file that are not TrainConfig fields (run names, logging
    and sweep settings shared with other tools) are skipped, so one file can serve several
    entry points; the resolved config is printed once on stderr;
  - the same numpy data, the same random windows: offsets come from numpy's global RNG
    seeded from --seed, exactly as in the PyTorch repo (so the batches are identical);
  - one jitted train step with fixed shapes (compiles once) and one jitted eval batch;
  - optimiser: optax.chain(clip_by_global_norm(grad_clip), adamw(schedule, b1=0.9, b2=0.95, eps=1e-8,
    weight_decay=0.1, mask=decay_mask)), where the mask selects every 2-D parameter (Dense
    kernels AND the two embeddings), as nanoGPT's configure_optimizers does. optax.adamw
    multiplies the decay by the learning rate, like torch.optim.AdamW;
  - the schedule is called with the update count before it is incremented, so update `it`
    (from 0) gets get_lr(it), as the PyTorch loop sets it by hand;
  - the loss is read to the host (float) every step for the log line, as the original's
    loss.item() is.

Output (one line each, flushed):
  step {i} loss {loss}                        every step (i counts from 1, after the update)
  eval step {i} items {n} loss {loss}         every --eval-every steps and after the last step
  metric val_loss={loss}                      once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from dataclasses import dataclass
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from data import make_dataset
from model import GPT, GPTConfig

BLOCK_SIZE = 32
DEFAULT_CONFIG = os.path.join(os.path.dirname(os.path.abspath(__file__)), "config.json")

Params = Any


@dataclass(frozen=True)
class TrainConfig:
    seed: int = 1337
    steps: int = 300
    eval_every: int = 100
    batch_size: int = 16
    eval_batch: int = 32
    eval_iters: int = 8
    lr: float = 2e-3
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    grad_clip: float = 1.0  # clip gradients at this global norm (0.0 disables)
    warmup_fraction: float = 0.1
    min_lr_ratio: float = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--config", default=DEFAULT_CONFIG, help="JSON file of TrainConfig fields")
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--steps", type=int, default=None)
    p.add_argument("--eval-every", type=int, default=None)
    p.add_argument("--lr", type=float, default=None)
    return p.parse_args(argv)


def load_config(args: argparse.Namespace) -> TrainConfig:
    """TrainConfig defaults, then the JSON file's TrainConfig keys, then the flags that were given."""
    cfg = TrainConfig()
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    if args.config:
        with open(args.config) as fh:
            from_file = json.load(fh)
        cfg = dataclasses.replace(cfg, **{k: v for k, v in from_file.items() if k in fields})
    flags = {k: v for k, v in vars(args).items() if k in fields and v is not None}
    return dataclasses.replace(cfg, **flags)


def make_schedule(total: int, peak: float, warmup_fraction: float, min_lr_ratio: float
                  ) -> Callable[[jax.Array], jax.Array]:
    """nanoGPT's get_lr as a traceable function of the update count (from 0)."""
    warmup = max(1, int(warmup_fraction * total))
    min_lr = min_lr_ratio * peak

    def schedule(count: jax.Array) -> jax.Array:
        it = jnp.asarray(count, jnp.float32)
        ratio = (it - warmup) / max(1, total - warmup)
        cosine = min_lr + 0.5 * (1.0 + jnp.cos(jnp.pi * ratio)) * (peak - min_lr)
        return jnp.where(it < warmup, peak * (it + 1) / (warmup + 1), cosine)

    return schedule


def decay_mask(params: Params) -> Params:
    """True for every 2-D parameter (kernels and embeddings), False for biases and LayerNorm."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def get_batch(data: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows: offsets from numpy's global RNG (seeded in main)."""
    ix = np.random.randint(0, len(data) - BLOCK_SIZE, size=batch_size)
    x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
    y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
    return x, y


def eval_offsets(data: np.ndarray, cfg: TrainConfig) -> np.ndarray:
    """eval_iters * eval_batch evenly spaced window offsets into the validation text."""
    return np.linspace(0, len(data) - BLOCK_SIZE - 1, cfg.eval_iters * cfg.eval_batch).astype(np.int64)


def loss_fn(model: GPT, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_train_step(model: GPT, tx: optax.GradientTransformation) -> Callable:
    @jax.jit
    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, x, y))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def evaluate(eval_loss: Callable, params: Params, data: np.ndarray, offsets: np.ndarray,
             cfg: TrainConfig) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (eval_iters batches of eval_batch)."""
    losses = []
    for k in range(cfg.eval_iters):
        ix = offsets[k * cfg.eval_batch : (k + 1) * cfg.eval_batch]
        x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
        y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
        losses.append(eval_loss(params, x, y))
    return cfg.eval_iters * cfg.eval_batch, float(jnp.stack(losses).mean())


def main(argv: list[str] | None = None) -> None:
    cfg = load_config(parse_args(argv))
    print(f"config: {json.dumps(dataclasses.asdict(cfg), sort_keys=True)}", file=sys.stderr, flush=True)
    np.random.seed(cfg.seed)
    key = jax.random.PRNGKey(cfg.seed)

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data, cfg)
    model = GPT(GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE))
    params = model.init(key, jnp.zeros((1, BLOCK_SIZE), jnp.int32))["params"]
    schedule = make_schedule(cfg.steps, cfg.lr, cfg.warmup_fraction, cfg.min_lr_ratio)
    adamw = optax.adamw(schedule, b1=cfg.beta1, b2=cfg.beta2, eps=cfg.eps, weight_decay=cfg.weight_decay,
                        mask=decay_mask)
    tx = optax.chain(optax.clip_by_global_norm(cfg.grad_clip), adamw) if cfg.grad_clip > 0 else adamw
    opt_state = tx.init(params)
    train_step = make_train_step(model, tx)
    eval_loss = jax.jit(lambda p, x, y: loss_fn(model, p, x, y))

    val_loss = float("nan")
    for it in range(cfg.steps):
        xb, yb = get_batch(train_data, cfg.batch_size)
        params, opt_state, loss = train_step(params, opt_state, xb.astype(np.int32), yb.astype(np.int32))

        step = it + 1
        print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % cfg.eval_every == 0 or step == cfg.steps:
            n, val_loss = evaluate(eval_loss, params, val_data.astype(np.int32), offsets, cfg)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    print(f"metric val_loss={val_loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
