"""Train the ConvNet on the synthetic pattern images (JAX + Flax NNX + Optax port, one device, functional NNX step).

Port notes: the reference runs PyTorch DDP over 2 processes (per-rank batch 32, gradients
averaged in backward). Here one nnx.jit step takes the whole global batch of 64 on one device:
with GroupNorm (per-sample statistics) and equal shards, the mean loss over the 64 items and its
gradient are exactly the average over the two ranks that DDP computes.

NNX habits of this port: the model is an nnx.Module (parameters and its dropout RNG stream live in
the object) and nnx.Optimizer(model, tx, wrt=nnx.Param) holds the optax state, but the step is
written in NNX's functional style for plain jax.jit: the model and the optimizer are each
nnx.split once into a static GraphDef and a State pytree; train_step merges them inside the trace,
runs nnx.value_and_grad and optimizer.update (which updates the model's parameters and the
optimizer's state in place, as with nnx.jit), and returns the new nnx.state(model), which
replaces the old one (donated with donate_argnums). Evaluation merges the current model state into
a host-side model, switches it to eval mode and runs an nnx.jit count step, one host read per
evaluation.

Optimizer: optax.chain(clip_by_global_norm(1.0), add_decayed_weights(5e-4), adam(schedule,
b1=0.9, b2=0.98, eps=1e-8)): clipping of the averaged gradient first, then torch Adam's coupled
L2 term (weight_decay * param added to the clipped gradient, for every parameter), then Adam.
The schedule is evaluated at the update count before it is incremented, so update i (from 1)
uses factor(i - 1), as torch's LambdaLR does. Batches: jax.random.permutation of the training
split per epoch (key folded with the epoch), 64 items per step, the last partial batch dropped
(another shuffle of the same kind as the reference's DistributedSampler order).

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps (mean loss over the global batch)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import math
from functools import partial
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

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


def make_tx(total_steps: int) -> optax.GradientTransformation:
    return optax.chain(
        optax.clip_by_global_norm(CLIP_NORM),
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.adam(make_schedule(total_steps), b1=BETAS[0], b2=BETAS[1], eps=EPS),
    )


def global_batches(n: int, seed: int) -> Iterator[np.ndarray]:
    """Index arrays of 64 items: a fresh permutation every epoch, the last partial batch dropped."""
    key = jax.random.key(seed)
    epoch = 0
    while True:
        order = np.asarray(jax.random.permutation(jax.random.fold_in(key, epoch), n))
        for b in range(n // GLOBAL_BATCH):
            yield order[b * GLOBAL_BATCH : (b + 1) * GLOBAL_BATCH]
        epoch += 1


def loss_fn(model: ConvNet, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = model(x)
    targets = optax.smooth_labels(jax.nn.one_hot(y, N_CLASSES), LABEL_SMOOTHING)
    return optax.softmax_cross_entropy(logits, targets).mean()


@partial(jax.jit, static_argnums=(0, 1), donate_argnums=2)
def train_step(model_def: nnx.GraphDef, opt_def: nnx.GraphDef, model_state: nnx.State, opt_state: nnx.State,
               x: jax.Array, y: jax.Array) -> tuple[jax.Array, nnx.State]:
    model = nnx.merge(model_def, model_state)
    optimizer = nnx.merge(opt_def, opt_state)
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss, nnx.state(model)


@nnx.jit
def eval_step(model: ConvNet, x: jax.Array, y: jax.Array) -> jax.Array:
    return (model(x).argmax(axis=-1) == y).sum()


def evaluate(graphdef: nnx.GraphDef, state: nnx.State, x: np.ndarray, y: np.ndarray) -> tuple[int, float]:
    """Accuracy over the whole test split (dropout off), one host read at the end."""
    model = nnx.merge(graphdef, state)
    model.eval()
    correct = jnp.zeros((), jnp.int32)
    for start in range(0, len(x), EVAL_BATCH):
        correct = correct + eval_step(model, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return len(x), int(correct) / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    params_seed, dropout_seed = jax.random.split(jax.random.key(args.seed))

    x_train, y_train, x_test, y_test = make_dataset()
    x_train, x_test = x_train.transpose(0, 2, 3, 1), x_test.transpose(0, 2, 3, 1)  # NCHW -> NHWC
    y_train, y_test = y_train.astype(np.int32), y_test.astype(np.int32)

    model = ConvNet(N_CLASSES, rngs=nnx.Rngs(params=params_seed, dropout=dropout_seed))
    optimizer = nnx.Optimizer(model, make_tx(args.steps), wrt=nnx.Param)
    batches = global_batches(len(x_train), args.seed)

    model.train()
    model_def, model_state = nnx.split(model)
    opt_def, opt_state = nnx.split(optimizer)
    del model, optimizer  # the state pytrees are the only copies from here on
    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches)
        loss, model_state = train_step(model_def, opt_def, model_state, opt_state, x_train[idx], y_train[idx])

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate(model_def, model_state, x_test, y_test)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
