"""Train the ConvNet on the synthetic pattern images (JAX + Flax + Optax port, one device, TrainState).

Port notes: the reference runs PyTorch DDP over 2 processes (per-rank batch 32, gradients
averaged in backward). Here one jitted step takes the whole global batch of 64 on one device:
with GroupNorm (per-sample statistics) and equal shards, the mean loss over the 64 items and its
gradient are exactly the average over the two ranks that DDP computes. The optimizer is
optax.chain(clip_by_global_norm(1.0), add_decayed_weights(5e-4), adam(schedule, b1=0.9,
b2=0.98, eps=1e-8)): clipping of the averaged gradient first, then torch Adam's coupled L2 term
(weight_decay * param added to the clipped gradient, for every parameter), then Adam. The
schedule is evaluated at the update count before it is incremented, so update i (from 1) uses
factor(i - 1), as torch's LambdaLR does. Parameters, optimizer and update count travel together in
a flax.training.train_state.TrainState (TrainState.create, state.apply_gradients), as in the Flax
examples. Labels: the input pipeline hands out one-hot float32 label vectors (the Flax examples'
`common_utils.onehot` habit) instead of class indices; the loss smooths them with
optax.smooth_labels and the accuracy compares argmaxes. Batches: a numpy permutation per epoch (seed, epoch),
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
from flax.training import train_state

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


def create_state(model: ConvNet, params: Params, tx: optax.GradientTransformation) -> train_state.TrainState:
    return train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)


def make_train_step(model: ConvNet) -> Callable:
    @jax.jit
    def train_step(state: train_state.TrainState, x: jax.Array, onehot: jax.Array, key: jax.Array):
        def loss_fn(params: Params) -> jax.Array:
            logits = state.apply_fn({"params": params}, x, train=True, rngs={"dropout": key})
            targets = optax.smooth_labels(onehot, LABEL_SMOOTHING)
            return optax.softmax_cross_entropy(logits, targets).mean()

        loss, grads = jax.value_and_grad(loss_fn)(state.params)
        return state.apply_gradients(grads=grads), loss

    return train_step


def make_eval_batch(model: ConvNet) -> Callable:
    @jax.jit
    def eval_batch(state: train_state.TrainState, x: jax.Array, onehot: jax.Array) -> jax.Array:
        logits = state.apply_fn({"params": state.params}, x, train=False)
        return (logits.argmax(axis=-1) == onehot.argmax(axis=-1)).sum()

    return eval_batch


def evaluate(eval_batch: Callable, state: train_state.TrainState, x: np.ndarray, onehot: np.ndarray) -> tuple[int, float]:
    """Accuracy over the whole test split."""
    correct = jnp.zeros((), jnp.int32)
    for start in range(0, len(x), EVAL_BATCH):
        correct = correct + eval_batch(state, x[start : start + EVAL_BATCH], onehot[start : start + EVAL_BATCH])
    return len(x), int(correct) / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(args.seed))

    x_train, y_train, x_test, y_test = make_dataset()
    x_train, x_test = x_train.transpose(0, 2, 3, 1), x_test.transpose(0, 2, 3, 1)  # NCHW -> NHWC
    eye = np.eye(N_CLASSES, dtype=np.float32)
    y_train, y_test = eye[y_train], eye[y_test]  # one-hot label vectors, (N, 8) float32

    model = ConvNet(N_CLASSES)
    tx = optax.chain(
        optax.clip_by_global_norm(CLIP_NORM),
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.adam(make_schedule(args.steps), b1=BETAS[0], b2=BETAS[1], eps=EPS),
    )
    params = model.init(init_key, jnp.zeros((1, *x_train.shape[1:])), train=False)["params"]
    state = create_state(model, params, tx)
    train_step = make_train_step(model)
    eval_batch = make_eval_batch(model)
    batches = global_batches(len(x_train), args.seed)

    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches)
        state, loss = train_step(state, x_train[idx], y_train[idx], jax.random.fold_in(dropout_key, step))

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate(eval_batch, state, x_test, y_test)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
