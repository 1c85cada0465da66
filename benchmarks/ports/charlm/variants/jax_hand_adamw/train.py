"""Train the tiny character GPT on the synthetic grammar corpus (JAX + Flax port, no optax).

Port notes:
  - the same numpy data, the same random windows: offsets come from numpy's global RNG
    seeded from --seed, exactly as in the PyTorch repo (so the batches are identical);
    the Flax init key is split off a root PRNGKey(seed);
  - one jitted train step with fixed shapes (compiles once) and one jitted eval batch;
  - the optimiser is written by hand, as torch.optim.AdamW computes it: the gradient from
    jax.value_and_grad, clipped to global norm 0.5 (clip_grad_norm_'s formula), then one
    jax.tree_util.tree_map over (param, grad, m, v) per leaf: decoupled decay
    p *= 1 - lr * 0.1 on every 2-D parameter (Dense kernels AND the two embeddings, as
    nanoGPT's groups), m and v with betas (0.9, 0.95), bias corrections with the step count,
    p -= lr / bc1 * m / (sqrt(v) / sqrt(bc2) + 1e-8). The state is a dict of m, v (float32,
    the params' tree) and the count;
  - the learning rate is the original's get_lr(it), a Python float computed on the host and
    passed to the jitted step as a float32 argument (data, not a constant: no recompilation);
  - the loss is read to the host (float) every step for the log line, as the original's
    loss.item() is.

Output (one line each, flushed):
  step {i} loss {loss}                        every step (i counts from 1, after the update)
  eval step {i} items {n} loss {loss}         every --eval-every steps and after the last step
  metric val_loss={loss}                      once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax  # the loss only

from data import make_dataset
from model import GPT, GPTConfig

BLOCK_SIZE = 32
BATCH_SIZE = 16
EVAL_BATCH = 32
EVAL_ITERS = 8
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
EPS = 1e-8
GRAD_CLIP = 0.5
WARMUP_FRACTION = 0.1
MIN_LR_RATIO = 0.1

Params = Any


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


def adamw_init(params: Params) -> dict[str, Any]:
    zeros = lambda p: jnp.zeros_like(p)  # noqa: E731
    return {"m": jax.tree_util.tree_map(zeros, params), "v": jax.tree_util.tree_map(zeros, params),
            "count": jnp.zeros((), jnp.int32)}


def clip_grads(grads: Params, max_norm: float) -> tuple[Params, jax.Array]:
    """torch.nn.utils.clip_grad_norm_: scale every gradient by min(1, max_norm / (global norm + 1e-6))."""
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in jax.tree_util.tree_leaves(grads)))
    coef = jnp.minimum(1.0, max_norm / (norm + 1e-6))
    return jax.tree_util.tree_map(lambda g: g * coef, grads), norm


def adamw_update(params: Params, grads: Params, state: dict[str, Any], lr: jax.Array) -> tuple[Params, dict]:
    """One torch.optim.AdamW step over the whole tree (decay only where the parameter is 2-D)."""
    b1, b2 = BETAS
    count = state["count"] + 1
    bc1 = 1.0 - b1 ** count.astype(jnp.float32)
    bc2 = 1.0 - b2 ** count.astype(jnp.float32)

    def leaf(p: jax.Array, g: jax.Array, m: jax.Array, v: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
        if p.ndim >= 2:  # nanoGPT's decay group: Dense kernels and the embeddings
            p = p * (1.0 - lr * WEIGHT_DECAY)
        m = b1 * m + (1.0 - b1) * g
        v = b2 * v + (1.0 - b2) * g * g
        p = p - (lr / bc1) * m / (jnp.sqrt(v) / jnp.sqrt(bc2) + EPS)
        return p, m, v

    out = jax.tree_util.tree_map(leaf, params, grads, state["m"], state["v"])
    outer, inner = jax.tree_util.tree_structure(params), jax.tree_util.tree_structure((0, 0, 0))
    new_params, m, v = jax.tree_util.tree_transpose(outer, inner, out)
    return new_params, {"m": m, "v": v, "count": count}


def get_batch(data: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows: offsets from numpy's global RNG (seeded in main)."""
    ix = np.random.randint(0, len(data) - BLOCK_SIZE, size=batch_size)
    x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
    y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
    return x, y


def eval_offsets(data: np.ndarray) -> np.ndarray:
    """EVAL_ITERS * EVAL_BATCH evenly spaced window offsets into the validation text."""
    return np.linspace(0, len(data) - BLOCK_SIZE - 1, EVAL_ITERS * EVAL_BATCH).astype(np.int64)


def loss_fn(model: GPT, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_train_step(model: GPT) -> Callable:
    @jax.jit
    def train_step(params: Params, opt_state: dict[str, Any], x: jax.Array, y: jax.Array, lr: jax.Array):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, x, y))(params)
        grads, _ = clip_grads(grads, GRAD_CLIP)
        params, opt_state = adamw_update(params, grads, opt_state, lr)
        return params, opt_state, loss

    return train_step


def evaluate(eval_loss: Callable, params: Params, data: np.ndarray, offsets: np.ndarray) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (EVAL_ITERS batches of EVAL_BATCH)."""
    losses = []
    for k in range(EVAL_ITERS):
        ix = offsets[k * EVAL_BATCH : (k + 1) * EVAL_BATCH]
        x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
        y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
        losses.append(eval_loss(params, x, y))
    return EVAL_ITERS * EVAL_BATCH, float(jnp.stack(losses).mean())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(args.seed)
    root = jax.random.PRNGKey(args.seed)
    init_key, _ = jax.random.split(root)

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data)
    cfg = GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE)
    model = GPT(cfg)
    params = model.init(init_key, jnp.zeros((1, BLOCK_SIZE), jnp.int32))["params"]
    opt_state = adamw_init(params)
    train_step = make_train_step(model)
    eval_loss = jax.jit(lambda p, x, y: loss_fn(model, p, x, y))

    val_loss = float("nan")
    for it in range(args.steps):
        lr = np.float32(get_lr(it, args.steps, args.lr))
        xb, yb = get_batch(train_data, BATCH_SIZE)
        params, opt_state, loss = train_step(params, opt_state, xb.astype(np.int32), yb.astype(np.int32), lr)

        step = it + 1
        print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            n, val_loss = evaluate(eval_loss, params, val_data.astype(np.int32), offsets)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    print(f"metric val_loss={val_loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
