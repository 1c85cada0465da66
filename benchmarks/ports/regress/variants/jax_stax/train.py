"""Train the MLP regressor on the synthetic tabular data set (JAX port, jax.example_libraries).

Port notes: no Flax and no Optax; the model is a stax.serial network (model.py) and the optimiser is
written with jax.example_libraries.optimizers' @optimizer decorator, reproducing
torch.optim.SGD(momentum=0.9, weight_decay=5e-4, dampening=0, nesterov=False) exactly:

    d = g + wd * p            (coupled decay, added to the gradient)
    v = momentum * v + d      (v starts at zero, so the first v equals d, as torch's buffer)
    p = p - lr(i) * v

MultiStepLR is a step-size function of the update index i the optimiser is handed (0 for the first
update): lr(i) = base * GAMMA ** #(milestones <= i), which is the rate torch uses at update i + 1
(its scheduler's last_epoch is i then); the rate drops from update milestone + 1 on, as in torch.
The update index is an int32 array argument of the jitted step, so it compiles once. The shuffle is
a np.random.permutation per epoch (global numpy RNG), seeded from the same constant; the init key is
jax.random.PRNGKey(SEED).

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.example_libraries import optimizers

from data import N_FEATURES, make_dataset
from model import mlp

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
    return p.parse_args(argv)


def multistep_lr(base_lr: float, total_steps: int) -> Callable[[jax.Array], jax.Array]:
    """torch's MultiStepLR as a function of the 0-based update index."""
    milestones = jnp.asarray([int(f * total_steps) for f in MILESTONES])

    def lr(i: jax.Array) -> jax.Array:
        return base_lr * GAMMA ** jnp.sum(i >= milestones)

    return lr


@optimizers.optimizer
def torch_sgd(step_size: Callable, mass: float, weight_decay: float):
    """torch.optim.SGD with momentum (dampening 0, no Nesterov) and coupled weight decay."""
    step_size = optimizers.make_schedule(step_size)

    def init(x0: jax.Array) -> tuple[jax.Array, jax.Array]:
        return x0, jnp.zeros_like(x0)

    def update(i: jax.Array, g: jax.Array, state: tuple[jax.Array, jax.Array]) -> tuple[jax.Array, jax.Array]:
        x, velocity = state
        d = g + weight_decay * x
        velocity = mass * velocity + d
        return x - step_size(i) * velocity, velocity

    def get_params(state: tuple[jax.Array, jax.Array]) -> jax.Array:
        return state[0]

    return init, update, get_params


def epoch_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch is dropped), global numpy RNG."""
    order = np.random.permutation(len(x))
    for b in range(len(x) // batch_size):
        idx = order[b * batch_size : (b + 1) * batch_size]
        yield x[idx], y[idx]


def make_train_step(apply_fun: Callable, opt_update: Callable, get_params: Callable) -> Callable:
    def loss_fn(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.mean((apply_fun(params, x) - y) ** 2)

    @jax.jit
    def train_step(i: jax.Array, opt_state: Any, x: jax.Array, y: jax.Array) -> tuple[Any, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(get_params(opt_state), x, y)
        return opt_update(i, grads, opt_state), loss

    return train_step


def make_eval_batch(apply_fun: Callable) -> Callable:
    @jax.jit
    def eval_batch(params: Any, x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.sum((apply_fun(params, x) - y) ** 2)

    return eval_batch


def evaluate(eval_batch: Callable, params: Any, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Mean squared error over every item of the test set."""
    sse = jnp.zeros(())
    for start in range(0, len(x), EVAL_BATCH):
        sse = sse + eval_batch(params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return float(sse) / len(x), len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(SEED)
    init_key = jax.random.PRNGKey(SEED)

    x_train, y_train, x_test, y_test = make_dataset()
    init_fun, apply_fun = mlp(N_FEATURES, args.hidden)
    _, params = init_fun(init_key, (-1, N_FEATURES))
    opt_init, opt_update, get_params = torch_sgd(multistep_lr(args.lr, args.steps), MOMENTUM, WEIGHT_DECAY)
    opt_state = opt_init(params)
    train_step = make_train_step(apply_fun, opt_update, get_params)
    eval_batch = make_eval_batch(apply_fun)

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, args.batch_size):
            opt_state, loss = train_step(jnp.asarray(step, jnp.int32), opt_state, xb, yb)
            step += 1

            running = running + loss
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jnp.zeros(())
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(eval_batch, get_params(opt_state), x_test, y_test)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
