"""Train the ConvNet on the synthetic pattern images (JAX + Flax + Optax port, 2-device mesh, sharded jit).

Port notes: the reference's 2 DDP ranks become the 2 devices of a 1-d mesh ("dp"); the program asks
XLA for 2 host devices through XLA_FLAGS unless already set. Each step's index array has the
reference's layout, (ranks, 32): row r is what rank r's DistributedSampler would hand out (one
numpy permutation per (seed, epoch), strided over the ranks, tail dropped), and the global batch of
64 is laid out rank 0's 32 items first, then placed with NamedSharding(mesh, P("dp")), so device r
holds "rank r's" half. The train step is one jax.jit with explicit in_shardings/out_shardings
(parameters and optimizer state replicated and donated, batch sharded): the partitioner inserts the
gradient all-reduce that DDP does in backward. The loss is torch's label-smoothed cross-entropy
written out, (1 - eps) * nll + eps * mean_k(-log p_k), averaged over the 64 items (the mean of the
two ranks' means). Optimizer: optax.chain(clip_by_global_norm(1.0), add_decayed_weights(5e-4),
adam(schedule, b1=0.9, b2=0.98, eps=1e-8)), torch's clip -> coupled L2 -> Adam; update i uses
factor(i - 1), like LambdaLR. Evaluation: the whole test split in one sharded call, each device
counts its 512 items and the partitioner sums the counts.

Output (one line each, flushed):
  step {i} loss {x}                  every 10 steps (global-batch mean)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import os

N_DEVICES = 2  # the reference's WORLD_SIZE
os.environ.setdefault("XLA_FLAGS", f"--xla_force_host_platform_device_count={N_DEVICES}")

import argparse  # noqa: E402
import math  # noqa: E402
from collections.abc import Callable, Iterator  # noqa: E402
from typing import Any  # noqa: E402

import jax  # noqa: E402
import jax.numpy as jnp  # noqa: E402
import numpy as np  # noqa: E402
import optax  # noqa: E402
from jax.sharding import Mesh, NamedSharding  # noqa: E402
from jax.sharding import PartitionSpec as P  # noqa: E402

from data import N_CLASSES, make_dataset  # noqa: E402
from model import ConvNet  # noqa: E402

PER_RANK_BATCH = 32
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
    """Index arrays of shape (ranks, 32): row r = rank r's next 32 items, as a DistributedSampler
    (shuffle, drop_last, set_epoch) per rank would give them; a fresh permutation every epoch."""
    per_rank = n // N_DEVICES
    epoch = 0
    while True:
        order = np.random.default_rng((seed, epoch)).permutation(n)[: per_rank * N_DEVICES]
        shards = order.reshape(per_rank, N_DEVICES).T  # shards[r] = order[r::N_DEVICES]
        for b in range(per_rank // PER_RANK_BATCH):
            yield shards[:, b * PER_RANK_BATCH : (b + 1) * PER_RANK_BATCH]
        epoch += 1


def smoothed_cross_entropy(logits: jax.Array, y: jax.Array, smoothing: float) -> jax.Array:
    """torch's CrossEntropyLoss(label_smoothing=eps) per item: (1 - eps) * nll + eps * mean_k(-log p_k)."""
    logp = jax.nn.log_softmax(logits, axis=-1)
    nll = -jnp.take_along_axis(logp, y[:, None], axis=-1)[:, 0]
    return (1.0 - smoothing) * nll - smoothing * logp.mean(axis=-1)


def make_train_step(model: ConvNet, tx: optax.GradientTransformation, mesh: Mesh) -> Callable:
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))

    def loss_fn(params: Params, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
        return smoothed_cross_entropy(logits, y, LABEL_SMOOTHING).mean()

    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array, key: jax.Array):
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return jax.jit(
        train_step,
        in_shardings=(replicated, replicated, sharded, sharded, replicated),
        out_shardings=(replicated, replicated, replicated),
        donate_argnums=(0, 1),
    )


def make_eval(model: ConvNet, mesh: Mesh) -> Callable:
    sharded = NamedSharding(mesh, P("dp"))

    def count_correct(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=False)
        return (logits.argmax(axis=-1) == y).sum()

    return jax.jit(count_correct, in_shardings=(NamedSharding(mesh, P()), sharded, sharded))


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    if jax.device_count() < N_DEVICES:
        raise SystemExit(f"need {N_DEVICES} devices, found {jax.device_count()} (XLA_FLAGS={os.environ.get('XLA_FLAGS')})")
    mesh = Mesh(np.array(jax.devices()[:N_DEVICES]), ("dp",))
    replicated, sharded = NamedSharding(mesh, P()), NamedSharding(mesh, P("dp"))
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
    params = jax.device_put(params, replicated)
    opt_state = jax.device_put(tx.init(params), replicated)
    train_step = make_train_step(model, tx, mesh)
    count_correct = make_eval(model, mesh)
    x_test_d, y_test_d = jax.device_put((x_test, y_test), sharded)
    batches = global_batches(len(x_train), args.seed)

    acc = float("nan")
    for step in range(1, args.steps + 1):
        idx = next(batches).reshape(-1)  # rank 0's 32 items, then rank 1's
        xb, yb = jax.device_put((x_train[idx], y_train[idx]), sharded)
        params, opt_state, loss = train_step(params, opt_state, xb, yb, jax.random.fold_in(dropout_key, step))

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            acc = int(count_correct(params, x_test_d, y_test_d)) / len(x_test)
            print(f"eval step {step} items {len(x_test)} acc {acc:.6f}", flush=True)

    print(f"metric test_acc={acc:.6f}", flush=True)


if __name__ == "__main__":
    main()
