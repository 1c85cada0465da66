"""Train the tiny character GPT on the synthetic grammar corpus (JAX + Flax + Optax port).

Port notes:
  - the same numpy data, the same random windows: offsets come from numpy's global RNG
    seeded from --seed, exactly as in the PyTorch repo (so the batches are identical);
  - one jitted train step with fixed shapes (compiles once) and one jitted eval batch;
  - optimiser: optax.chain(clip_by_global_norm(0.5), adamw(schedule, b1=0.9, b2=0.95, eps=1e-8,
    weight_decay=0.1, mask=decay_mask)), where the mask selects every 2-D parameter (Dense
    kernels AND the two embeddings), as nanoGPT's configure_optimizers does. optax.adamw
    multiplies the decay by the learning rate, like torch.optim.AdamW;
  - the schedule is called with the update count before it is incremented, so update `it`
    (from 0) gets get_lr(it), as the PyTorch loop sets it by hand;
  - the loss is read to the host (float) every step for the log line, as the original's
    loss.item() is;
  - the input pipeline hands the model time-major batches, as the sequence examples of Flax do:
    time_major() turns get_batch's (B, T) inputs and targets into contiguous (T, B) arrays (the
    evaluation windows too, (T, EVAL_BATCH)); the model is called with time_major=True and returns
    (T, B, V) logits, and the loss is the mean token cross-entropy over the same B x T tokens.

Output (one line each, flushed):
  step {i} loss {loss}                        every step (i counts from 1, after the update)
  eval step {i} items {n} loss {loss}         every --eval-every steps and after the last step
  metric val_loss={loss}                      once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def make_schedule(total: int, peak: float) -> Callable[[jax.Array], jax.Array]:
    """nanoGPT's get_lr as a traceable function of the update count (from 0)."""
    warmup = max(1, int(WARMUP_FRACTION * total))
    min_lr = MIN_LR_RATIO * peak

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


def time_major(x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(B, T) inputs and targets -> contiguous (T, B) int32 arrays."""
    return np.ascontiguousarray(x.T.astype(np.int32)), np.ascontiguousarray(y.T.astype(np.int32))


def eval_offsets(data: np.ndarray) -> np.ndarray:
    """EVAL_ITERS * EVAL_BATCH evenly spaced window offsets into the validation text."""
    return np.linspace(0, len(data) - BLOCK_SIZE - 1, EVAL_ITERS * EVAL_BATCH).astype(np.int64)


def loss_fn(model: GPT, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    """x, y: time-major (T, B) token ids."""
    logits = model.apply({"params": params}, x, time_major=True)  # (T, B, V)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_train_step(model: GPT, tx: optax.GradientTransformation) -> Callable:
    @jax.jit
    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, x, y))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def evaluate(eval_loss: Callable, params: Params, data: np.ndarray, offsets: np.ndarray) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (EVAL_ITERS batches of EVAL_BATCH)."""
    losses = []
    for k in range(EVAL_ITERS):
        ix = offsets[k * EVAL_BATCH : (k + 1) * EVAL_BATCH]
        x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
        y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
        losses.append(eval_loss(params, *time_major(x, y)))
    return EVAL_ITERS * EVAL_BATCH, float(jnp.stack(losses).mean())


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(args.seed)
    key = jax.random.PRNGKey(args.seed)

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data)
    cfg = GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE)
    model = GPT(cfg)
    params = model.init(key, jnp.zeros((1, BLOCK_SIZE), jnp.int32))["params"]
    tx = optax.chain(
        optax.clip_by_global_norm(GRAD_CLIP),
        optax.adamw(make_schedule(args.steps, args.lr), b1=BETAS[0], b2=BETAS[1], eps=EPS,
                    weight_decay=WEIGHT_DECAY, mask=decay_mask),
    )
    opt_state = tx.init(params)
    train_step = make_train_step(model, tx)
    eval_loss = jax.jit(lambda p, x, y: loss_fn(model, p, x, y))

    val_loss = float("nan")
    for it in range(args.steps):
        xb, yb = get_batch(train_data, BATCH_SIZE)
        params, opt_state, loss = train_step(params, opt_state, *time_major(xb, yb))

        step = it + 1
        print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            n, val_loss = evaluate(eval_loss, params, val_data.astype(np.int32), offsets)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    print(f"metric val_loss={val_loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
