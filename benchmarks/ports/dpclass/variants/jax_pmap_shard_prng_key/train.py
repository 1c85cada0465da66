"""Train the ConvNet on the synthetic pattern images (JAX + Flax + Optax port, jax.pmap).

Port notes: the reference's 2 DDP ranks become 2 pmap replicas (2 CPU devices here: the program
asks XLA for them through XLA_FLAGS unless already set). Each replica gets 32 items of the global
batch of 64 and computes the mean loss and its gradient over them; lax.pmean averages the
gradients over the replicas (DDP's all-reduce), and every replica then applies the same
optax.chain(clip_by_global_norm(1.0), add_decayed_weights(5e-4), adam(schedule, b1=0.9, b2=0.98,
eps=1e-8)) to the averaged gradient: clip after the all-reduce, then torch Adam's coupled L2
term, then Adam. The schedule is evaluated at the update count before it is incremented
(update i uses factor(i - 1), like LambdaLR). Dropout keys as in the Flax examples: the host
carries an rng, splits off a step key every step (rng, step_rng = jax.random.split(rng)), and
flax.training.common_utils.shard_prng_key(step_rng) splits it into one key per device, passed to
the pmapped step along the replica axis (own dropout stream per rank). Parameters and optimizer
state are replicated; the logged loss is the pmean of the replicas' losses (the global-batch
mean, as the reference's all-reduced loss).

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import os

N_REPLICAS = 2  # the reference's world size
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={N_REPLICAS}")

import argparse  # noqa: E402
import math  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from functools import partial  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from flax.training import common_utils  # noqa: E402
from jax import lax  # noqa: E402

from data import N_CLASSES, make_dataset  # noqa: E402
from model import ConvNet  # noqa: E402

PER_REPLICA_BATCH = 32
GLOBAL_BATCH = N_REPLICAS * PER_REPLICA_BATCH
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
AXIS = "replica"

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
    """Index arrays of shape (N_REPLICAS, 32): a fresh permutation every epoch, split over the replicas."""
    epoch = 0
    while True:
        order = np.random.default_rng((seed, epoch)).permutation(n)
        for b in range(n // GLOBAL_BATCH):
            yield order[b * GLOBAL_BATCH : (b + 1) * GLOBAL_BATCH].reshape(N_REPLICAS, PER_REPLICA_BATCH)
        epoch += 1


def make_train_step(model: ConvNet, tx: optax.GradientTransformation) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
        targets = optax.smooth_labels(jax.nn.one_hot(y, N_CLASSES), LABEL_SMOOTHING)
        return optax.softmax_cross_entropy(logits, targets).mean()

    @partial(jax.pmap, axis_name=AXIS, in_axes=(0, 0, 0, 0, 0), donate_argnums=(0, 1))
    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array, key: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        grads = lax.pmean(grads, AXIS)  # the all-reduce: average over the replicas
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, lax.pmean(loss, AXIS)

    return train_step


def make_eval_batch(model: ConvNet) -> Callable:
    @jax.jit
    def eval_batch(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=False)
        return (logits.argmax(axis=-1) == y).sum()

    return eval_batch


def evaluate(eval_batch: Callable, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[int, float]:
    """Accuracy over the whole test split, with replica 0's parameters (all replicas hold the same)."""
    params = jax.tree.map(lambda a: a[0], params)
    correct = jnp.zeros((), jnp.int32)
    for start in range(0, len(x), EVAL_BATCH):
        correct = correct + eval_batch(params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return len(x), int(correct) / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    devices = jax.local_devices()[:N_REPLICAS]
    if len(devices) < N_REPLICAS:
        raise SystemExit(f"need {N_REPLICAS} devices, found {len(devices)} (XLA_FLAGS={os.environ.get('XLA_FLAGS')})")
    init_key, rng = jax.random.split(jax.random.PRNGKey(args.seed))

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
    # replicate: a leading replica axis, one copy per device (pmap shards it over the devices)
    params, opt_state = jax.tree.map(lambda a: jnp.broadcast_to(a, (N_REPLICAS, *a.shape)), (params, opt_state))
    train_step = make_train_step(model, tx)
    eval_batch = make_eval_batch(model)
    batches = global_batches(len(x_train), args.seed)

    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches)
        rng, step_rng = jax.random.split(rng)
        params, opt_state, loss = train_step(
            params, opt_state, x_train[idx], y_train[idx], common_utils.shard_prng_key(step_rng)
        )

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {float(loss[0]):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate(eval_batch, params, x_test, y_test)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
