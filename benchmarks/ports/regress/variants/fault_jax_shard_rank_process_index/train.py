"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax + Optax port, per-device shards).

Port notes: data parallelism the jit way over a 1-d mesh ("data") of all local
devices (on CPU: XLA_FLAGS=--xla_force_host_platform_device_count=4), with the
input pipeline written like torch's DistributedSampler: each epoch draws one
permutation of the training rows from a key derived from the seed and the
epoch (jax.random.fold_in(order_key, epoch), the set_epoch habit), and device
d takes every num_shards-th index from its rank (order[rank::num_shards]),
the rank being the replica's process index as in a multi-host launch. Step b feeds
each device rows b*32 .. b*32+31 of its own shard; the global batch of 128 is
assembled from those per-device pieces with jax.make_array_from_single_device_arrays
(sharding P("data")), so no row crosses devices on the host side. The 4
shards of one epoch partition the permutation, so every epoch is still one
pass over 12800 distinct rows in 100 batches of 128, each batch a uniformly
random set of rows (the reference's distribution; another order stream).
The step is an ordinary jitted function of the GLOBAL batch: the loss is the
mean over all 128 rows and XLA inserts the all-reduce of the gradients.
Parameters and optimiser state replicated (NamedSharding(mesh, P())).
The optimiser reproduces torch.optim.SGD(momentum=0.9, weight_decay=5e-4):
add_decayed_weights FIRST (coupled decay), then optax.sgd = trace(0.9) ->
scale_by_learning_rate; MultiStepLR is a piecewise_constant_schedule on the
same milestones (update i uses count i - 1, as torch's last_epoch).
Randomness: PRNGKey(SEED) split into an init key and an order key.

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import functools
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from jax.sharding import Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from data import N_FEATURES, make_dataset
from model import MLP

SEED = 1234
LOG_EVERY = 25
EVAL_BATCH = 256
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
MILESTONES = (0.5, 0.75)  # fractions of --steps
GAMMA = 0.1

Params = Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--device", default=jax.default_backend(), help="JAX platform: cpu, gpu or tpu")
    return p.parse_args(argv)


def multistep_schedule(base_lr: float, total_steps: int) -> optax.Schedule:
    """torch's MultiStepLR(milestones=[int(f * steps) for f in MILESTONES], gamma=GAMMA), per update."""
    counts = Counter(int(f * total_steps) for f in MILESTONES)
    return optax.piecewise_constant_schedule(base_lr, {m: GAMMA**c for m, c in counts.items()})


def epoch_order(order_key: jax.Array, epoch: int, n: int) -> np.ndarray:
    """This epoch's permutation of the n training rows (the sampler's set_epoch: a key per epoch)."""
    return np.asarray(jax.random.permutation(jax.random.fold_in(order_key, epoch), n))


def shard_rows(order: np.ndarray, num_shards: int, shard_index: int) -> np.ndarray:
    """DistributedSampler's split: every num_shards-th index of the epoch's order, from shard_index."""
    return order[shard_index::num_shards]


def device_batches(
    x: np.ndarray, y: np.ndarray, order: np.ndarray, batch_size: int, mesh: Mesh
) -> Iterator[tuple[jax.Array, jax.Array]]:
    """One epoch of global batches: each device's rows from its own shard, assembled into one array."""
    devices = list(mesh.devices.flat)
    num_shards = len(devices)
    per_device = batch_size // num_shards
    # One shard per replica, as DistributedSampler(num_replicas=world size, rank=process index) gives.
    shards = [shard_rows(order, num_shards, shard_index=jax.process_index()) for _ in devices]
    sharding = NamedSharding(mesh, P("data"))
    for b in range(len(shards[0]) // per_device):  # full per-device batches only (drop_last)
        rows = [s[b * per_device : (b + 1) * per_device] for s in shards]
        xb = jax.make_array_from_single_device_arrays(
            (batch_size, x.shape[1]), sharding, [jax.device_put(x[r], d) for r, d in zip(rows, devices)]
        )
        yb = jax.make_array_from_single_device_arrays(
            (batch_size, y.shape[1]), sharding, [jax.device_put(y[r], d) for r, d in zip(rows, devices)]
        )
        yield xb, yb


def make_train_step(model: MLP, tx: optax.GradientTransformation, mesh: Mesh) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        pred = model.apply({"params": params}, x)
        return jnp.mean((pred - y) ** 2)

    replicated = NamedSharding(mesh, P())
    batch_sharded = NamedSharding(mesh, P("data"))

    @functools.partial(
        jax.jit,
        in_shardings=(replicated, replicated, batch_sharded, batch_sharded),
        out_shardings=(replicated, replicated, replicated),
    )
    def train_step(
        params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array
    ) -> tuple[Params, optax.OptState, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def make_eval_batch(model: MLP) -> Callable:
    @jax.jit
    def eval_batch(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.sum((model.apply({"params": params}, x) - y) ** 2)

    return eval_batch


def evaluate(eval_batch: Callable, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Mean squared error over every item of the test set."""
    sse = jnp.zeros(())
    for start in range(0, len(x), EVAL_BATCH):
        sse = sse + eval_batch(params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return float(sse) / len(x), len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    init_key, order_key = jax.random.split(jax.random.PRNGKey(SEED))
    mesh = Mesh(np.array(jax.devices(args.device)), ("data",))
    replicated = NamedSharding(mesh, P())

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, args.hidden)
    tx = optax.chain(
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.sgd(multistep_schedule(args.lr, args.steps), momentum=MOMENTUM, nesterov=False),
    )
    # Replicated over the mesh up front, so the step compiles once.
    params = jax.device_put(model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"], replicated)
    opt_state = jax.device_put(tx.init(params), replicated)
    train_step = make_train_step(model, tx, mesh)
    eval_batch = make_eval_batch(model)

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jax.device_put(jnp.zeros(()), replicated)
    test_mse = float("nan")
    for epoch in range(epochs):
        order = epoch_order(order_key, epoch, len(x_train))
        for xb, yb in device_batches(x_train, y_train, order, args.batch_size, mesh):
            params, opt_state, loss = train_step(params, opt_state, xb, yb)
            step += 1

            running = running + loss
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jax.device_put(jnp.zeros(()), replicated)
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(eval_batch, params, x_test, y_test)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
