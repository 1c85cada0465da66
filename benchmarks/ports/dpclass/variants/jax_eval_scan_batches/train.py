"""Train the ConvNet on the synthetic pattern images (JAX + Flax + Optax port, one device).

Port notes: the reference runs PyTorch DDP over 2 processes (per-rank batch 32, gradients
averaged in backward). Here one jitted step takes the whole global batch of 64 on one device:
with GroupNorm (per-sample statistics) and equal shards, the mean loss over the 64 items and its
gradient are exactly the average over the two ranks that DDP computes. The optimizer is
optax.chain(clip_by_global_norm(1.0), add_decayed_weights(5e-4), adam(schedule, b1=0.9,
b2=0.98, eps=1e-8)): clipping of the averaged gradient first, then torch Adam's coupled L2 term
(weight_decay * param added to the clipped gradient, for every parameter), then Adam. The
schedule is evaluated at the update count before it is incremented, so update i (from 1) uses
factor(i - 1), as torch's LambdaLR does. Evaluation: the test split is put on the device once,
as (4, 256, ...) batches, and one jitted function scans over them (jax.lax.scan) accumulating the
correct count, read once per evaluation: the same 1024 items and count as a Python loop of
per-batch calls. Batches: a numpy permutation per epoch (seed, epoch),
64 items per step, last partial batch dropped (the reference's DistributedSampler order is
torch's RNG; this is another shuffle of the same kind).

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps (mean loss over the global batch)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def global_batches(n: int, seed: int) -> Iterator[np.ndarray]:
    """Index arrays of 64 items: a fresh permutation every epoch, the last partial batch dropped."""
    epoch = 0
    while True:
        order = np.random.default_rng((seed, epoch)).permutation(n)
        for b in range(n // GLOBAL_BATCH):
            yield order[b * GLOBAL_BATCH : (b + 1) * GLOBAL_BATCH]
        epoch += 1


def make_train_step(model: ConvNet, tx: optax.GradientTransformation) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
        targets = optax.smooth_labels(jax.nn.one_hot(y, N_CLASSES), LABEL_SMOOTHING)
        return optax.softmax_cross_entropy(logits, targets).mean()

    @jax.jit
    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array, key: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def make_evaluate(model: ConvNet) -> Callable:
    @jax.jit
    def count_correct(params: Params, xs: jax.Array, ys: jax.Array) -> jax.Array:
        def body(total: jax.Array, batch: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, None]:
            x, y = batch
            logits = model.apply({"params": params}, x, train=False)
            return total + (logits.argmax(axis=-1) == y).sum(), None

        total, _ = jax.lax.scan(body, jnp.zeros((), jnp.int32), (xs, ys))
        return total

    return count_correct


def evaluate(count_correct: Callable, params: Params, xs: jax.Array, ys: jax.Array) -> tuple[int, float]:
    """Accuracy over the whole test split (xs: the split as (batches, EVAL_BATCH, ...) on the device)."""
    items = ys.shape[0] * ys.shape[1]
    return items, int(count_correct(params, xs, ys)) / items


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(args.seed))

    x_train, y_train, x_test, y_test = make_dataset()
    x_train, x_test = x_train.transpose(0, 2, 3, 1), x_test.transpose(0, 2, 3, 1)  # NCHW -> NHWC
    y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)

    model = ConvNet(N_CLASSES)
    tx = optax.chain(
        optax.clip_by_global_norm(CLIP_NORM),
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.adam(make_schedule(args.steps), b1=BETAS[0], b2=BETAS[1], eps=EPS),
    )
    params = model.init(init_key, jnp.zeros((1, *x_train.shape[1:])), train=False)["params"]
    opt_state = tx.init(params)
    train_step = make_train_step(model, tx)
    count_correct = make_evaluate(model)
    assert len(x_test) % EVAL_BATCH == 0
    xs_test = jax.device_put(x_test.reshape(-1, EVAL_BATCH, *x_test.shape[1:]))
    ys_test = jax.device_put(y_test.reshape(-1, EVAL_BATCH))
    batches = global_batches(len(x_train), args.seed)

    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches)
        params, opt_state, loss = train_step(
            params, opt_state, x_train[idx], y_train[idx], jax.random.fold_in(dropout_key, step)
        )

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate(count_correct, params, xs_test, ys_test)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
