"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax + Optax port).

Port notes: data parallelism with jax.pmap over all local devices (on CPU:
XLA_FLAGS=--xla_force_host_platform_device_count=4). Parameters and optimiser
state carry a leading device axis (one identical replica per device); each
batch is reshaped to (devices, batch / devices, ...). The loss is written the
way the large-scale JAX recipes write it, normalised by the GLOBAL batch: each
replica differentiates sum(local squared errors) / global_batch, its share of
the global mean, and the shares are added up with lax.psum over the "data"
axis, for the gradients (the all-reduce) and for the logged loss alone. The
sum of the shares is exactly the gradient (and the value) of the mean over
the global batch of 128, whatever the shard sizes; every replica applies the
same update. Evaluation runs on replica 0's parameters.

torch.optim.SGD's weight_decay=5e-4 is coupled: it adds wd * p to the
gradient before the momentum buffer. Here that term comes from the objective,
as many JAX codebases write it: each replica's objective is its share of the
global-batch MSE plus the L2 penalty (wd / 2) * sum of squared parameters
(every weight and bias, as torch decays every parameter), whose gradient is
grad + wd * p. The logged loss is the MSE share only (the penalty rides along
as has_aux), psum'd like the gradients. The optimiser is then optax.sgd(
momentum=0.9, nesterov=False) alone (trace -> scale_by_learning_rate, torch's
order; optax's trace starts from zeros, so its first step equals torch's
buffer initialised to the gradient). MultiStepLR is an optax
piecewise_constant_schedule with the same milestones, evaluated at the update
count before increment, as torch's last_epoch. The shuffle uses the global numpy RNG
(np.random.permutation per epoch), seeded from the same constant.

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


def epoch_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch is dropped), global numpy RNG."""
    order = np.random.permutation(len(x))
    for b in range(len(x) // batch_size):
        idx = order[b * batch_size : (b + 1) * batch_size]
        yield x[idx], y[idx]


def make_train_step(model: MLP, tx: optax.GradientTransformation) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        """This replica's share of the global-batch mean (local sum / global batch size), plus L2."""
        pred = model.apply({"params": params}, x)
        global_batch = x.shape[0] * jax.lax.psum(1, axis_name="data")
        mse_share = jnp.sum((pred - y) ** 2) / global_batch
        l2 = sum(jnp.sum(p**2) for p in jax.tree.leaves(params))
        return mse_share + 0.5 * WEIGHT_DECAY * l2, mse_share

    @functools.partial(jax.pmap, axis_name="data")
    def train_step(
        params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array
    ) -> tuple[Params, optax.OptState, jax.Array]:
        (_, loss), grads = jax.value_and_grad(loss_fn, has_aux=True)(params, x, y)
        # Shares of one global objective: add them up (not average them).
        grads = jax.lax.psum(grads, axis_name="data")
        loss = jax.lax.psum(loss, axis_name="data")
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


def replicate(tree: Any, devices: list[jax.Device]) -> Any:
    """One copy per device along a new leading axis, laid out as pmap lays out its outputs."""
    sharding = NamedSharding(Mesh(np.array(devices), ("data",)), P("data"))
    n = len(devices)
    return jax.device_put(jax.tree.map(lambda a: jnp.broadcast_to(a, (n, *a.shape)), tree), sharding)


def shard(a: np.ndarray, n: int) -> np.ndarray:
    """(batch, ...) -> (devices, batch / devices, ...)."""
    return a.reshape(n, a.shape[0] // n, *a.shape[1:])


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(SEED)
    init_key = jax.random.PRNGKey(SEED)
    devices = jax.local_devices(backend=args.device)
    n_devices = len(devices)
    if args.batch_size % n_devices:
        raise SystemExit(f"--batch-size must be divisible by the {n_devices} devices")

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, args.hidden)
    tx = optax.sgd(multistep_schedule(args.lr, args.steps), momentum=MOMENTUM, nesterov=False)
    params = model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"]
    opt_state = tx.init(params)
    params, opt_state = replicate(params, devices), replicate(opt_state, devices)
    train_step = make_train_step(model, tx)
    eval_batch = make_eval_batch(model)

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, args.batch_size):
            params, opt_state, loss = train_step(
                params, opt_state, shard(xb, n_devices), shard(yb, n_devices)
            )
            step += 1

            running = running + loss[0]
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jnp.zeros(())
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(eval_batch, jax.tree.map(lambda a: a[0], params), x_test, y_test)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
