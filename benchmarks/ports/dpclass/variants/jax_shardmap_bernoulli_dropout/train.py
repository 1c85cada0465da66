"""Train the ConvNet on the synthetic pattern images (JAX + Flax + Optax port, jax.shard_map over 2 devices).

Port notes: data parallelism over a 1-d device mesh ("data", 2 CPU devices, one per reference
rank: the program asks XLA for them through XLA_FLAGS unless already set). The global batch of 64
is sharded over the mesh, 32 items per device (rank 0's half on device 0). Inside jax.shard_map
each device computes the mean loss over its 32 items and lax.pmean averages it over the mesh (the
global-batch mean); the step differentiates that averaged loss with respect to the replicated
parameters, so the gradient is the global-batch mean's (DDP's averaged gradient) and is already
the same on every device (differentiating each device's own loss instead would give the SUM over
the devices for replicated parameters). Outside the shard_map, in the same jitted step, the
gradient goes through optax.chain(clip_by_global_norm(1.0), add_decayed_weights(5e-4),
adam(schedule, b1=0.9, b2=0.98, eps=1e-8)): clip after the all-reduce, torch Adam's coupled L2
term, Adam; update i uses factor(i - 1), like LambdaLR.

Dropout is written out in model.py (an inverted-dropout keep mask from jax.random.bernoulli with
the "dropout" rng, survivors scaled by 1 / 0.8, training only); each device folds its mesh index
into the step's dropout key, so each device (each reference rank) draws its own masks.

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps (global-batch mean)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import os

N_DEVICES = 2  # the reference's world size
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={N_DEVICES}")

import argparse  # noqa: E402
import math  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax import lax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from data import N_CLASSES, make_dataset  # noqa: E402
from model import ConvNet  # noqa: E402

GLOBAL_BATCH = 64
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


def make_train_step(model: ConvNet, tx: optax.GradientTransformation, mesh: Mesh) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
        targets = optax.smooth_labels(jax.nn.one_hot(y, N_CLASSES), LABEL_SMOOTHING)
        return optax.softmax_cross_entropy(logits, targets).mean()

    def local_grads(params: Params, x: jax.Array, y: jax.Array, key: jax.Array):
        key = jax.random.fold_in(key, lax.axis_index("data"))  # own dropout stream per device

        def global_loss(p: Params) -> jax.Array:
            return lax.pmean(loss_fn(p, x, y, key), "data")  # the all-reduce: mean over the devices

        return jax.value_and_grad(global_loss)(params)

    sharded_grads = jax.shard_map(
        local_grads, mesh=mesh, in_specs=(P(), P("data"), P("data"), P()), out_specs=(P(), P())
    )

    @jax.jit
    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array, key: jax.Array):
        loss, grads = sharded_grads(params, x, y, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def make_eval_batch(model: ConvNet) -> Callable:
    @jax.jit
    def eval_batch(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=False)
        return (logits.argmax(axis=-1) == y).sum()

    return eval_batch


def evaluate(eval_batch: Callable, params: Params, x: jax.Array, y: jax.Array) -> tuple[int, float]:
    """Accuracy over the whole test split (batches sharded over the mesh like the training batches)."""
    correct = jnp.zeros((), jnp.int32)
    for start in range(0, len(x), EVAL_BATCH):
        correct = correct + eval_batch(params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return len(x), int(correct) / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if jax.device_count() < N_DEVICES:
        raise SystemExit(f"need {N_DEVICES} devices, found {jax.device_count()} (XLA_FLAGS={os.environ.get('XLA_FLAGS')})")
    mesh = Mesh(np.array(jax.devices()[:N_DEVICES]), ("data",))
    replicated, batch_sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("data"))
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
    params, opt_state = jax.device_put((params, opt_state), replicated)
    x_test_d, y_test_d = jax.device_put((x_test, y_test), batch_sharded)
    train_step = make_train_step(model, tx, mesh)
    eval_batch = make_eval_batch(model)
    batches = global_batches(len(x_train), args.seed)

    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches)
        xb, yb = jax.device_put((x_train[idx], y_train[idx]), batch_sharded)
        params, opt_state, loss = train_step(params, opt_state, xb, yb, jax.random.fold_in(dropout_key, step))

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            items, acc = evaluate(eval_batch, params, x_test_d, y_test_d)
            print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
