"""Train the ConvNet on the synthetic pattern images (JAX + Flax port, one device, Adam by hand).

Port notes: the reference runs PyTorch DDP over 2 processes (per-rank batch 32, gradients
averaged in backward). Here one jitted step takes the whole global batch of 64 on one device:
with GroupNorm (per-sample statistics) and equal shards, the mean loss over the 64 items and its
gradient are exactly the average over the two ranks that DDP computes. There is no optax: the
step is jax.value_and_grad of the loss, then torch's update written out with
jax.tree_util.tree_map over the parameter tree, in torch's order:
  clip_grad_norm_(1.0)    g <- g * min(1, max_norm / (||g|| + 1e-6)) over all leaves together
  Adam weight_decay       g <- g + 5e-4 * p (coupled L2, every parameter)
  Adam (0.9, 0.98, 1e-8)  m <- b1 m + (1 - b1) g,  v <- b2 v + (1 - b2) g^2,
                          p <- p - lr * (m / (1 - b1^t)) / (sqrt(v / (1 - b2^t)) + eps)
The optimizer state (count, m, v) is a NamedTuple of pytrees carried by the step. The LR of
update t (from 1) is LR * factor(t - 1), as torch's LambdaLR gives it.

Randomness: every stream comes from --seed. The JAX root key PRNGKey(seed) is folded with a
stream tag (0: init, 1: dropout); each step's dropout key is the dropout key folded with the step.
The data order comes from one numpy Generator seeded with seed, drawing a fresh permutation every
epoch (64 items per step, last partial batch dropped): another shuffle of the kind the
reference's DistributedSampler draws.

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps (mean loss over the global batch)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

from data import N_CLASSES, make_dataset
from model import ConvNet

GLOBAL_BATCH = 64  # the reference's 2 ranks x 32
EVAL_BATCH = 256
LOG_EVERY = 10
LR = 1e-3
BETAS = (0.9, 0.98)
EPS = 1e-8
WEIGHT_DECAY = 5e-4
CLIP_NORM = 1.0
LABEL_SMOOTHING = 0.1
WARMUP_FRACTION = 0.05
MIN_LR_RATIO = 0.1

Params = Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    return p.parse_args(argv)


def make_schedule(total_steps: int) -> Callable[[jax.Array], jax.Array]:
    """LR at update count c (from 0): linear warmup over 5% of the steps, cosine to 10% of the peak."""
    warmup = max(1, int(WARMUP_FRACTION * total_steps))

    def schedule(count: jax.Array) -> jax.Array:
        count = jnp.asarray(count, jnp.float32)
        progress = (count - warmup) / max(1, total_steps - warmup)
        cosine = MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + jnp.cos(math.pi * progress))
        return LR * jnp.where(count < warmup, (count + 1) / warmup, cosine)

    return schedule


def global_batches(n: int, rng: np.random.Generator) -> Iterator[np.ndarray]:
    """Index arrays of 64 items: a fresh permutation from rng every epoch, the last partial batch dropped."""
    while True:
        order = rng.permutation(n)
        for b in range(n // GLOBAL_BATCH):
            yield order[b * GLOBAL_BATCH : (b + 1) * GLOBAL_BATCH]


class AdamState(NamedTuple):
    count: jax.Array  # updates taken so far
    mu: Params  # first moment (torch's exp_avg)
    nu: Params  # second moment (torch's exp_avg_sq)


def adam_init(params: Params) -> AdamState:
    zeros = lambda: jax.tree_util.tree_map(jnp.zeros_like, params)
    return AdamState(count=jnp.zeros((), jnp.int32), mu=zeros(), nu=zeros())


def adam_update(grads: Params, state: AdamState, params: Params,
                schedule: Callable[[jax.Array], jax.Array]) -> tuple[Params, AdamState]:
    """torch's clip_grad_norm_ then Adam with coupled weight decay, on the whole parameter tree."""
    leaves = jax.tree_util.tree_leaves(grads)
    norm = jnp.sqrt(sum(jnp.sum(jnp.square(g)) for g in leaves))
    clip = jnp.minimum(1.0, CLIP_NORM / (norm + 1e-6))
    grads = jax.tree_util.tree_map(lambda g, p: g * clip + WEIGHT_DECAY * p, grads, params)

    b1, b2 = BETAS
    count = state.count + 1
    mu = jax.tree_util.tree_map(lambda g, m: b1 * m + (1 - b1) * g, state.mu, grads)
    nu = jax.tree_util.tree_map(lambda g, v: b2 * v + (1 - b2) * jnp.square(g), grads, state.nu)
    lr = schedule(state.count)  # update t uses factor(t - 1)
    t = count.astype(jnp.float32)
    bc1, bc2 = 1 - b1**t, 1 - b2**t
    new_params = jax.tree_util.tree_map(
        lambda p, m, v: p - lr * (m / bc1) / (jnp.sqrt(v / bc2) + EPS), params, mu, nu
    )
    return new_params, AdamState(count=count, mu=mu, nu=nu)


def smoothed_targets(y: jax.Array) -> jax.Array:
    """torch's label smoothing: (1 - eps) on the true class plus eps / K on every class."""
    return jax.nn.one_hot(y, N_CLASSES) * (1.0 - LABEL_SMOOTHING) + LABEL_SMOOTHING / N_CLASSES


def make_train_step(model: ConvNet, schedule: Callable[[jax.Array], jax.Array]) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
        logp = jax.nn.log_softmax(logits, axis=-1)
        return -jnp.sum(smoothed_targets(y) * logp, axis=-1).mean()

    @jax.jit
    def train_step(params: Params, opt_state: AdamState, x: jax.Array, y: jax.Array, key: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        params, opt_state = adam_update(grads, opt_state, params, schedule)
        return params, opt_state, loss

    return train_step


def make_eval_batch(model: ConvNet) -> Callable:
    @jax.jit
    def eval_batch(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=False)
        return (logits.argmax(axis=-1) == y).sum()

    return eval_batch


def evaluate(eval_batch: Callable, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[int, float]:
    """Accuracy over the whole test split."""
    correct = jnp.zeros((), jnp.int32)
    for start in range(0, len(x), EVAL_BATCH):
        correct = correct + eval_batch(params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return len(x), int(correct) / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    root = jax.random.PRNGKey(args.seed)
    init_key, dropout_key = jax.random.fold_in(root, 0), jax.random.fold_in(root, 1)
    data_rng = np.random.default_rng(args.seed)

    x_train, y_train, x_test, y_test = make_dataset()
    x_train, x_test = x_train.transpose(0, 2, 3, 1), x_test.transpose(0, 2, 3, 1)  # NCHW -> NHWC
    y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)

    model = ConvNet(N_CLASSES)
    params = model.init(init_key, jnp.zeros((1, *x_train.shape[1:])), train=False)["params"]
    opt_state = adam_init(params)
    train_step = make_train_step(model, make_schedule(args.steps))
    eval_batch = make_eval_batch(model)
    batches = global_batches(len(x_train), data_rng)

    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches)
        params, opt_state, loss = train_step(
            params, opt_state, x_train[idx], y_train[idx], jax.random.fold_in(dropout_key, step)
        )

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate(eval_batch, params, x_test, y_test)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
