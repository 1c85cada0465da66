"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax + Optax port).

Port notes: written in the flax.training.train_state idiom: parameters, the
optax transformation and its state live in one TrainState, the jitted step
takes and returns the state. The update is spelled out in the step as in
optax's quick-start (state.tx.update on the gradients, optax.apply_updates),
so that the update tree is at hand for the monitoring the accelerator
version adds, and the step counter is bumped with state.replace. One compilation (fixed shapes, full
batches only; the state is committed to the device up front). The
optimiser reproduces torch.optim.SGD(momentum=0.9, weight_decay=5e-4):
add_decayed_weights comes FIRST in the chain, so the decay is added to the
gradient before the momentum trace (coupled, as torch does), then optax.sgd =
trace(0.9, nesterov=False) -> scale_by_learning_rate. optax's trace starts
from zeros, so its first step equals torch's buffer initialised to the
gradient. MultiStepLR is an optax piecewise_constant_schedule with the same
milestones: optax evaluates the schedule at the update count BEFORE
incrementing it, so update i (from 1) uses count i - 1, exactly the
last_epoch torch's scheduler has at that update; the rate drops from update
milestone + 1 on, as in torch. The shuffle uses the global numpy RNG
(np.random.permutation per epoch), seeded from the same constant.

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax.training import train_state

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


def create_train_state(
    model: MLP, tx: optax.GradientTransformation, key: jax.Array, device: jax.Device
) -> train_state.TrainState:
    params = model.init(key, jnp.zeros((1, N_FEATURES)))["params"]
    state = train_state.TrainState.create(apply_fn=model.apply, params=params, tx=tx)
    return jax.device_put(state, device)


def make_train_step() -> Callable:
    def loss_fn(params: Params, apply_fn: Callable, x: jax.Array, y: jax.Array) -> jax.Array:
        pred = apply_fn({"params": params}, x)
        return jnp.mean((pred - y) ** 2)

    @jax.jit
    def train_step(
        state: train_state.TrainState, x: jax.Array, y: jax.Array
    ) -> tuple[train_state.TrainState, jax.Array]:
        loss, grads = jax.value_and_grad(loss_fn)(state.params, state.apply_fn, x, y)
        updates, opt_state = state.tx.update(grads, state.opt_state, state.params)
        params = optax.apply_updates(state.params, updates)
        return state.replace(step=state.step + 1, params=params), loss

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
    tx = optax.chain(
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.sgd(multistep_schedule(args.lr, args.steps), momentum=MOMENTUM, nesterov=False),
    )
    # Placed (committed) on the device up front, so the step compiles once.
    state = create_train_state(model, tx, init_key, device)
    train_step = make_train_step()
    eval_batch = make_eval_batch(model)

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, args.batch_size):
            xb, yb = jax.device_put((xb, yb), device)
            state, loss = train_step(state, xb, yb)
            step += 1

            running = running + loss
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jnp.zeros(())
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(eval_batch, state.params, x_test, y_test)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
