"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax port, hand-written SGD).

Port notes: no optax. torch.optim.SGD(momentum=0.9, dampening=0, nesterov=False,
weight_decay=5e-4) is written out as a pytree update, exactly as torch's
_single_tensor_sgd does it:
    d   = g + weight_decay * p          (coupled decay, before the momentum)
    buf = momentum * buf + d            (buf starts at zero, so the first buf is d,
                                         as torch initialises it to the first d)
    p   = p - lr * buf
MultiStepLR is a function of the number of updates already taken (torch's
last_epoch when optimizer.step() runs): lr = base * gamma ** #(milestones <= count),
so the rate drops from update milestone + 1 on, as in torch. The update count
lives in the optimiser state (an int32 array), so the jitted step compiles once.
The shuffle uses the global numpy RNG (np.random.permutation per epoch), seeded
from the same constant.

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterator
from typing import Any, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np

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


class SGDState(NamedTuple):
    count: jax.Array  # updates taken so far (torch's scheduler last_epoch)
    momentum: Params  # torch's momentum_buffer, one per parameter


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--device", default=jax.default_backend(), help="JAX platform: cpu, gpu or tpu")
    return p.parse_args(argv)


def multistep_lr(base_lr: float, total_steps: int) -> Callable[[jax.Array], jax.Array]:
    """torch's MultiStepLR(milestones=[int(f * steps) for f in MILESTONES], gamma=GAMMA) at update count."""
    milestones = jnp.asarray([int(f * total_steps) for f in MILESTONES])

    def lr(count: jax.Array) -> jax.Array:
        return base_lr * GAMMA ** jnp.sum(milestones <= count)

    return lr


def sgd_init(params: Params) -> SGDState:
    return SGDState(count=jnp.zeros((), jnp.int32), momentum=jax.tree.map(jnp.zeros_like, params))


def sgd_update(grads: Params, state: SGDState, params: Params, lr: jax.Array) -> tuple[Params, SGDState]:
    """One torch.optim.SGD step (momentum, dampening 0, coupled weight decay, no Nesterov)."""
    d = jax.tree.map(lambda g, p: g + WEIGHT_DECAY * p, grads, params)
    buf = jax.tree.map(lambda b, di: MOMENTUM * b + di, state.momentum, d)
    new_params = jax.tree.map(lambda p, b: p - lr * b, params, buf)
    return new_params, SGDState(count=state.count + 1, momentum=buf)


def epoch_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch is dropped), global numpy RNG."""
    order = np.random.permutation(len(x))
    for b in range(len(x) // batch_size):
        idx = order[b * batch_size : (b + 1) * batch_size]
        yield x[idx], y[idx]


def make_train_step(model: MLP, lr_fn: Callable[[jax.Array], jax.Array]) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        pred = model.apply({"params": params}, x)
        return jnp.mean((pred - y) ** 2)

    @jax.jit
    def train_step(
        params: Params, opt_state: SGDState, x: jax.Array, y: jax.Array
    ) -> tuple[Params, SGDState, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(params, x, y)
        params, opt_state = sgd_update(grads, opt_state, params, lr_fn(opt_state.count))
        return params, opt_state, loss

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
    np.random.seed(SEED)
    init_key = jax.random.PRNGKey(SEED)
    device = jax.devices(args.device)[0]

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, args.hidden)
    # Placed (committed) on the device up front, so the step compiles once.
    params = jax.device_put(model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"], device)
    opt_state = jax.device_put(sgd_init(params), device)
    train_step = make_train_step(model, multistep_lr(args.lr, args.steps))
    eval_batch = make_eval_batch(model)

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, args.batch_size):
            xb, yb = jax.device_put((xb, yb), device)
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
