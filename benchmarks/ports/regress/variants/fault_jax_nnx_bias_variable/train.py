"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax NNX + Optax port).

Port notes: the model is an nnx.Module and the optimiser an nnx.Optimizer over
its nnx.Param variables; train_step and eval_batch are nnx.jit functions that
update the model and optimiser in place (fixed shapes: full batches only, so
each compiles once). The optimiser reproduces torch.optim.SGD(momentum=0.9,
weight_decay=5e-4): add_decayed_weights comes FIRST in the chain, so the decay
is added to the gradient before the momentum trace (coupled, as torch does),
then optax.sgd = trace(0.9, nesterov=False) -> scale_by_learning_rate. optax's
trace starts from zeros, so its first step equals torch's buffer initialised
to the gradient. MultiStepLR is an optax piecewise_constant_schedule with the
same milestones (evaluated at the update count before it is incremented, i.e.
torch's last_epoch at that update). The shuffle uses the global numpy RNG
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
from collections.abc import Iterator

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from data import N_FEATURES, make_dataset
from model import MLP

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


def make_tx(base_lr: float, total_steps: int) -> optax.GradientTransformation:
    """torch.optim.SGD(lr, momentum, weight_decay) + MultiStepLR(milestones, gamma), per update."""
    counts = Counter(int(f * total_steps) for f in MILESTONES)
    schedule = optax.piecewise_constant_schedule(base_lr, {m: GAMMA**c for m, c in counts.items()})
    return optax.chain(
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.sgd(schedule, momentum=MOMENTUM, nesterov=False),
    )


def epoch_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch is dropped), global numpy RNG."""
    order = np.random.permutation(len(x))
    for b in range(len(x) // batch_size):
        idx = order[b * batch_size : (b + 1) * batch_size]
        yield x[idx], y[idx]


def loss_fn(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.mean((model(x) - y) ** 2)


@nnx.jit
def train_step(model: MLP, optimizer: nnx.Optimizer, x: jax.Array, y: jax.Array) -> jax.Array:
    loss, grads = nnx.value_and_grad(loss_fn)(model, x, y)
    optimizer.update(model, grads)
    return loss


@nnx.jit
def eval_batch(model: MLP, x: jax.Array, y: jax.Array) -> jax.Array:
    return jnp.sum((model(x) - y) ** 2)


def evaluate(model: MLP, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Mean squared error over every item of the test set (the MLP has no train/eval modes)."""
    sse = jnp.zeros(())
    n = 0
    for start in range(0, len(x), EVAL_BATCH):
        xb, yb = x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH]
        sse = sse + eval_batch(model, xb, yb)
        n += len(xb)
    return float(sse) / n, n


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(SEED)
    device = jax.devices(args.device)[0]

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, args.hidden, rngs=nnx.Rngs(params=jax.random.key(SEED)))
    optimizer = nnx.Optimizer(model, make_tx(args.lr, args.steps), wrt=nnx.Param)
    # Model and optimiser state placed (committed) on the device up front, so the step compiles once.
    nnx.update((model, optimizer), jax.device_put(nnx.state((model, optimizer)), device))

    epochs = math.ceil(args.steps / (len(x_train) // args.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, args.batch_size):
            xb, yb = jax.device_put((xb, yb), device)
            loss = train_step(model, optimizer, xb, yb)
            step += 1

            running = running + loss
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jnp.zeros(())
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(model, x_test, y_test)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
