"""Train the MLP regressor on the synthetic tabular data set (JAX + Flax + Optax port).

Port notes: the hyperparameters live in a TrainConfig (config.py): dataclass
defaults, then configs/regress.json (the program's values), then the command-line
flags. One jitted train step with fixed shapes (full batches only). The
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

import math
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from config import TrainConfig, build_parser, load_config
from data import N_FEATURES, make_dataset
from model import MLP

Params = Any


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    return load_config(build_parser(__doc__).parse_args(argv))


def multistep_schedule(cfg: TrainConfig) -> optax.Schedule:
    """torch's MultiStepLR(milestones=[int(f * steps) for f in milestones], gamma), per update."""
    counts = Counter(int(f * cfg.steps) for f in cfg.milestones)
    return optax.piecewise_constant_schedule(cfg.lr, {m: cfg.gamma**c for m, c in counts.items()})


def epoch_batches(x: np.ndarray, y: np.ndarray, batch_size: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """One epoch of shuffled full batches (the last partial batch is dropped), global numpy RNG."""
    order = np.random.permutation(len(x))
    for b in range(len(x) // batch_size):
        idx = order[b * batch_size : (b + 1) * batch_size]
        yield x[idx], y[idx]


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


def evaluate(
    eval_batch: Callable, params: Params, x: np.ndarray, y: np.ndarray, batch: int
) -> tuple[float, int]:
    """Mean squared error over every item of the test set."""
    sse = jnp.zeros(())
    for start in range(0, len(x), batch):
        sse = sse + eval_batch(params, x[start : start + batch], y[start : start + batch])
    return float(sse) / len(x), len(x)


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    np.random.seed(cfg.seed)
    init_key = jax.random.PRNGKey(cfg.seed)
    device = jax.devices(cfg.device)[0]

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, cfg.hidden)
    tx = optax.chain(
        optax.add_decayed_weights(cfg.weight_decay),
        optax.sgd(multistep_schedule(cfg), momentum=cfg.momentum, nesterov=False),
    )
    # Placed (committed) on the device up front, so the step compiles once.
    params = jax.device_put(model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"], device)
    opt_state = jax.device_put(tx.init(params), device)
    train_step = make_train_step(model, tx)
    eval_batch = make_eval_batch(model)

    epochs = math.ceil(cfg.steps / (len(x_train) // cfg.batch_size))
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    for epoch in range(epochs):
        for xb, yb in epoch_batches(x_train, y_train, cfg.batch_size):
            xb, yb = jax.device_put((xb, yb), device)
            params, opt_state, loss = train_step(params, opt_state, xb, yb)
            step += 1

            running = running + loss
            if step % cfg.log_every == 0:
                print(f"train step {step} loss {float(running) / cfg.log_every:.6f}", flush=True)
                running = jnp.zeros(())
            if step % cfg.eval_every == 0 or step == cfg.steps:
                test_mse, n = evaluate(eval_batch, params, x_test, y_test, cfg.eval_batch)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == cfg.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
