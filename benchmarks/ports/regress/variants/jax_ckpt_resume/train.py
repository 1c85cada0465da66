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

Preemption drill: the job runs under preemption on the cluster, so every run
checkpoints itself once, at --checkpoint-at (a fraction of --steps, 0.5 by
default), and resumes from the file as a restarted job would: params, the
optax state (momentum trace and the update count the schedule reads), the
step, the position in the epoch, the running loss and the global numpy RNG
state (as it was before the epoch's permutation was drawn) go to
<--ckpt-dir>/ckpt.msgpack + ckpt.pkl; the training state is then thrown
away, rebuilt from scratch (fresh model.init and tx.init) and overwritten by
the restored one, the epoch's permutation is redrawn from the restored RNG
state and the batches already done are skipped. The jitted step and eval
functions are reused (a restarted process would compile them again).

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import pickle
from pathlib import Path
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

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
    p.add_argument("--checkpoint-at", type=float, default=0.5, help="fraction of --steps (0 or 1: never)")
    p.add_argument("--ckpt-dir", default="checkpoints")
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


def evaluate(eval_batch: Callable, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[float, int]:
    """Mean squared error over every item of the test set."""
    sse = jnp.zeros(())
    for start in range(0, len(x), EVAL_BATCH):
        sse = sse + eval_batch(params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH])
    return float(sse) / len(x), len(x)


def build_state(model: MLP, tx: optax.GradientTransformation, init_key: jax.Array, device: Any) -> tuple:
    """Fresh params and optimiser state, committed to the device (as a restarted job builds them)."""
    params = jax.device_put(model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"], device)
    opt_state = jax.device_put(tx.init(params), device)
    return params, opt_state


def save_checkpoint(ckpt_dir: Path, params: Params, opt_state: optax.OptState, meta: dict) -> None:
    """Arrays as flax msgpack, the loop position and the numpy RNG state as a pickle; atomic renames."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    blob = serialization.to_bytes({"params": jax.device_get(params), "opt_state": jax.device_get(opt_state)})
    for name, data in (("ckpt.msgpack", blob), ("ckpt.pkl", pickle.dumps(meta))):
        tmp = ckpt_dir / (name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, ckpt_dir / name)


def restore_checkpoint(ckpt_dir: Path, params: Params, opt_state: optax.OptState, device: Any) -> tuple:
    """Overwrite the freshly built state with the checkpoint's; returns (params, opt_state, meta)."""
    target = {"params": jax.device_get(params), "opt_state": jax.device_get(opt_state)}
    state = serialization.from_bytes(target, (ckpt_dir / "ckpt.msgpack").read_bytes())
    meta = pickle.loads((ckpt_dir / "ckpt.pkl").read_bytes())
    np.random.set_state(meta["epoch_rng"])  # the state the current epoch's permutation was drawn from
    return jax.device_put(state["params"], device), jax.device_put(state["opt_state"], device), meta


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    np.random.seed(SEED)
    init_key = jax.random.PRNGKey(SEED)
    device = jax.devices(args.device)[0]
    ckpt_dir = Path(args.ckpt_dir)
    ckpt_step = int(args.checkpoint_at * args.steps)

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, args.hidden)
    tx = optax.chain(
        optax.add_decayed_weights(WEIGHT_DECAY),
        optax.sgd(multistep_schedule(args.lr, args.steps), momentum=MOMENTUM, nesterov=False),
    )
    # Placed (committed) on the device up front, so the step compiles once.
    params, opt_state = build_state(model, tx, init_key, device)
    train_step = make_train_step(model, tx)
    eval_batch = make_eval_batch(model)

    steps_per_epoch = len(x_train) // args.batch_size
    epochs = math.ceil(args.steps / steps_per_epoch)
    step, start_epoch, skip = 0, 0, 0
    running = jnp.zeros(())
    test_mse = float("nan")
    resumed = False
    while True:
        preempted = False
        for epoch in range(start_epoch, epochs):
            epoch_rng = np.random.get_state()
            batches = epoch_batches(x_train, y_train, args.batch_size)
            first = skip if epoch == start_epoch else 0
            for b, (xb, yb) in enumerate(itertools.islice(batches, first, None), start=first):
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
                if step == ckpt_step and not resumed:
                    meta = {"step": step, "epoch": epoch, "batch": b + 1, "epoch_rng": epoch_rng,
                            "running": float(running), "test_mse": test_mse}
                    save_checkpoint(ckpt_dir, params, opt_state, meta)
                    preempted = True
                    break
            if preempted or step == args.steps:
                break
        if not preempted:
            break
        # "Preemption": drop the training state, rebuild it and resume from the files.
        del params, opt_state, running
        params, opt_state = build_state(model, tx, init_key, device)
        params, opt_state, meta = restore_checkpoint(ckpt_dir, params, opt_state, device)
        step, start_epoch, skip = meta["step"], meta["epoch"], meta["batch"]
        running, test_mse = jnp.asarray(meta["running"], jnp.float32), meta["test_mse"]
        resumed = True
        print(f"resumed from {ckpt_dir} at step {step}", flush=True)

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
