"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax + Optax port).

Port notes: the update is a TrainStep object whose __call__ is jitted with the
object itself as a static argument (functools.partial(jax.jit,
static_argnums=0)), so it compiles once for the run and the compiled step is
cached with the object. The optimiser reproduces torch.optim.SGD(momentum=0.9,
weight_decay=5e-4) the way torch applies it: add_decayed_weights FIRST (the
decay is added to the gradient before the momentum buffer, coupled), then
optax.trace(0.9, nesterov=False), whose trace is torch's momentum buffer
(starting from zeros, its first value equals torch's buffer initialised to the
gradient), and the parameters move by -lr * buffer. The learning rate is driven
from the host like torch's scheduler: before every update the host sets
train_step.lr to MultiStepLR's value for that update (lr * 0.1 ** number of
milestones already passed: update i runs at last_epoch i - 1, so the rate drops
from update milestone + 1 on, as in torch). The shuffle uses the global numpy
RNG (np.random.permutation per epoch), seeded from the same constant.

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import functools
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

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


def multistep_lr(base_lr: float, total_steps: int, updates_done: int) -> float:
    """torch's MultiStepLR(milestones=[int(f * steps) for f in MILESTONES], gamma=GAMMA) after
    `updates_done` scheduler steps: the rate of the next update."""
    milestones = [int(f * total_steps) for f in MILESTONES]
    return base_lr * GAMMA ** sum(m <= updates_done for m in milestones)


def epoch_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch is dropped), global numpy RNG."""
    order = np.random.permutation(len(x))
    for b in range(len(x) // batch_size):
        idx = order[b * batch_size : (b + 1) * batch_size]
        yield x[idx], y[idx]


class TrainStep:
    """One SGD update; the host sets .lr before each call, as torch's scheduler sets param_groups."""

    def __init__(self, model: MLP, tx: optax.GradientTransformation, lr: float) -> None:
        self.model = model
        self.tx = tx  # decay + momentum trace; the rate is applied in __call__
        self.lr = lr

    def loss_fn(self, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        pred = self.model.apply({"params": params}, x)
        return jnp.mean((pred - y) ** 2)

    @functools.partial(jax.jit, static_argnums=0)
    def __call__(
        self, params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array
    ) -> tuple[Params, optax.OptState, jax.Array]:
        loss, grads = jax.value_and_grad(self.loss_fn)(params, x, y)
        buf, opt_state = self.tx.update(grads, opt_state, params)
        updates = jax.tree.map(lambda b: -self.lr * b, buf)
        return optax.apply_updates(params, updates), opt_state, loss


def make_train_step(model: MLP, tx: optax.GradientTransformation, lr: float) -> TrainStep:
    return TrainStep(model, tx, lr)


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
    np.random.seed(SEED)
    init_key = jax.random.PRNGKey(SEED)
    device = jax.devices(args.device)[0]

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, args.hidden)
    tx = optax.chain(
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.trace(decay=MOMENTUM, nesterov=False),
    )
    # Placed (committed) on the device up front, so the step compiles once.
    params = jax.device_put(model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"], device)
    opt_state = jax.device_put(tx.init(params), device)
    train_step = make_train_step(model, tx, args.lr)
    eval_batch = make_eval_batch(model)

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, args.batch_size):
            xb, yb = jax.device_put((xb, yb), device)
            train_step.lr = multistep_lr(args.lr, args.steps, step)  # scheduler: rate of this update
            params, opt_state, loss = train_step(params, opt_state, xb, yb)
            step += 1

            running = running + loss
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jnp.zeros(())
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(eval_batch, params, x_test, y_test)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
