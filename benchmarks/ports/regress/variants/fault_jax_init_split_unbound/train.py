"""Train the MLP regressor on the synthetic tabular data set (plain JAX port: no Flax, no Optax).

Port notes: the model is a dict of arrays (model.py); gradients come from
jax.value_and_grad and torch.optim.SGD(momentum=0.9, dampening=0,
nesterov=False, weight_decay=5e-4) is written out with jax.tree_util.tree_map,
in the order torch's _single_tensor_sgd applies it:
    d   = g + weight_decay * p          (coupled decay, before the momentum)
    buf = momentum * buf + d            (buf starts at zero, so the first buf is d,
                                         as torch initialises it to the first d)
    p   = p - lr * buf
MultiStepLR stays on the host, as torch's scheduler does: the rate for the next
update is base * gamma ** #(milestones <= updates taken), handed to the jitted
step as a float32 array argument (a traced value: one compilation).

Randomness: one root key, jax.random.PRNGKey(SEED). The init key is
fold_in(root, 0); the data order comes from a numpy Generator seeded with an
integer drawn from fold_in(root, 1), one fresh permutation per epoch. No global
numpy or jax state is used.

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator

import jax
import jax.numpy as jnp
import numpy as np

from data import N_FEATURES, make_dataset
from model import Params, init_mlp, mlp_apply

SEED = 1234
LOG_EVERY = 25
EVAL_BATCH = 256
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
MILESTONES = (0.5, 0.75)  # fractions of --steps
GAMMA = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--device", default=jax.default_backend(), help="JAX platform: cpu, gpu or tpu")
    return p.parse_args(argv)


class MultiStepLR:
    """torch's MultiStepLR(milestones=[int(f * steps) for f in MILESTONES], gamma=GAMMA), on the host."""

    def __init__(self, base_lr: float, total_steps: int) -> None:
        self.base_lr = base_lr
        self.milestones = [int(f * total_steps) for f in MILESTONES]
        self.last_epoch = 0  # updates taken so far

    def get_lr(self) -> float:
        return self.base_lr * GAMMA ** sum(m <= self.last_epoch for m in self.milestones)

    def step(self) -> None:
        self.last_epoch += 1


def epoch_batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, rng: np.random.Generator
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch is dropped) from the data generator."""
    order = rng.permutation(len(x))
    for b in range(len(x) // batch_size):
        idx = order[b * batch_size : (b + 1) * batch_size]
        yield x[idx], y[idx]


def sgd_init(params: Params) -> Params:
    """torch's momentum_buffer, one per parameter, zeros."""
    return jax.tree_util.tree_map(jnp.zeros_like, params)


def sgd_update(grads: Params, momentum: Params, params: Params, lr: jax.Array) -> tuple[Params, Params]:
    """One torch.optim.SGD step (momentum, dampening 0, coupled weight decay, no Nesterov)."""
    d = jax.tree_util.tree_map(lambda g, p: g + WEIGHT_DECAY * p, grads, params)
    momentum = jax.tree_util.tree_map(lambda b, di: MOMENTUM * b + di, momentum, d)
    params = jax.tree_util.tree_map(lambda p, b: p - lr * b, params, momentum)
    return params, momentum


def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((mlp_apply(params, x) - y) ** 2)


def make_train_step() -> Callable:
    @jax.jit
    def train_step(
        params: Params, momentum: Params, lr: jax.Array, x: jax.Array, y: jax.Array
    ) -> tuple[Params, Params, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params, momentum = sgd_update(grads, momentum, params, lr)
        return params, momentum, loss

    return train_step


@jax.jit
def eval_batch(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum((mlp_apply(params, x) - y) ** 2)


def evaluate(params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Mean squared error over every item of the test set."""
    sse = jnp.zeros(())
    for start in range(0, len(x), EVAL_BATCH):
        sse = sse + eval_batch(params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return float(sse) / len(x), len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = jax.devices(args.device)[0]
    root = jax.random.PRNGKey(SEED)
    init_key = jax.random.fold_in(root, 0)
    data_seed = int(jax.random.randint(jax.random.fold_in(root, 1), (), 0, 2**31 - 1))
    data_rng = np.random.default_rng(data_seed)

    x_train, y_train, x_test, y_test = make_dataset()
    params = jax.device_put(init_mlp(init_key, N_FEATURES, args.hidden), device)
    momentum = jax.device_put(sgd_init(params), device)
    scheduler = MultiStepLR(args.lr, args.steps)
    train_step = make_train_step()

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, args.batch_size, data_rng):
            xb, yb = jax.device_put((xb, yb), device)
            lr = np.float32(scheduler.get_lr())
            params, momentum, loss = train_step(params, momentum, lr, xb, yb)
            scheduler.step()
            step += 1

            running = running + loss
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jnp.zeros(())
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(params, x_test, y_test)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
