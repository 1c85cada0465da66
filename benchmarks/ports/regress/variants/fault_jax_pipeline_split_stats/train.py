"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax + Optax port).

Port notes: one jitted train step with fixed shapes (full batches only). The
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

Input pipeline (pipeline.py), written the grain way: the raw splits from
data.make_raw_splits go through ArraySource -> IndexSampler -> Normalize.map ->
Batch. Each pipeline owns its Normalize, fitted by make_loader on the split it
reads (no statistics passed around between pipelines); the training sampler
draws one permutation per pass and Batch drops the last short batch
(drop_last), the test pipeline runs in order in batches of EVAL_BATCH.

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

from data import N_FEATURES, make_raw_splits
from model import MLP
from pipeline import ArraySource, Batch, DataLoader, IndexSampler, Normalize

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


def make_loader(x: np.ndarray, y: np.ndarray, batch_size: int, *, train: bool) -> DataLoader:
    """The pipeline over one split: shuffled full batches for training, every record in order for the test."""
    return DataLoader(ArraySource(x, y), IndexSampler(len(x), shuffle=train), Normalize.fit(x),
                      Batch(batch_size, drop_remainder=train))


def epoch_batches(loader: DataLoader) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One pass of the pipeline (a fresh permutation when it shuffles): (x, y) float32 batches."""
    for batch in loader:
        yield batch["x"], batch["y"]


def make_train_step(model: MLP, tx: optax.GradientTransformation) -> Callable:
    def loss_fn(params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
        pred = model.apply({"params": params}, x)
        return jnp.mean((pred - y) ** 2)

    @jax.jit
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


def evaluate(eval_batch: Callable, params: Params, loader: DataLoader) -> tuple[float, int]:
    """Mean squared error over every item of the test pipeline."""
    sse, n = jnp.zeros(()), 0
    for xb, yb in epoch_batches(loader):
        sse = sse + eval_batch(params, xb, yb)
        n += len(xb)
    return float(sse) / n, n


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(SEED)
    init_key = jax.random.PRNGKey(SEED)
    device = jax.devices(args.device)[0]

    x_train, y_train, x_test, y_test = make_raw_splits()
    train_loader = make_loader(x_train, y_train, args.batch_size, train=True)
    test_loader = make_loader(x_test, y_test, EVAL_BATCH, train=False)
    model = MLP(N_FEATURES, args.hidden)
    tx = optax.chain(
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.sgd(multistep_schedule(args.lr, args.steps), momentum=MOMENTUM, nesterov=False),
    )
    # Placed (committed) on the device up front, so the step compiles once.
    params = jax.device_put(model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"], device)
    opt_state = jax.device_put(tx.init(params), device)
    train_step = make_train_step(model, tx)
    eval_batch = make_eval_batch(model)

    epochs = math.ceil(args.steps / len(train_loader))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(train_loader):
            xb, yb = jax.device_put((xb, yb), device)
            params, opt_state, loss = train_step(params, opt_state, xb, yb)
            step += 1

            running = running + loss
            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {float(running) / LOG_EVERY:.6f}", flush=True)
                running = jnp.zeros(())
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(eval_batch, params, test_loader)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
