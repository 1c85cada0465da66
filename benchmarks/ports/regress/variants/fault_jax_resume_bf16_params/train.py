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

Preemption drill: the job runs on preemptible TPU VMs and never runs start to
end in one process, so train.py is also its own launcher. Run without
--worker it makes a checkpoint directory and starts one worker process per
segment, in a row: the job is preempted after --preempt-at (fractions of
--steps, default 0.55: update 220 of a short run, 880 of a full one,
mid-epoch), so the workers are `sys.executable train.py <same args> --worker
--start a --stop b`, with the same environment. Each worker trains updates
a+1..b and, unless b is the last step, writes a checkpoint and exits: the
params and the whole optax state (momentum trace, and the update count the
schedule reads) as flax msgpack, the params stored in bfloat16 (the serving
checkpoint format, half the bytes; they are restored into the float32
template), and a pickle of the step, the running loss, the last test MSE and
the global numpy RNG state before the current epoch's permutation and at the
checkpoint. The next worker seeds and builds everything as a fresh job would,
restores the checkpoint into the fresh state, redraws the epoch's permutation,
skips the batches already done and continues. A worker that fails ends the
launcher with its exit code.

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
import shutil
import subprocess
import sys
import tempfile
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
CHECKPOINT_DTYPE = jnp.bfloat16  # parameters on disk

Params = Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--device", default=jax.default_backend(), help="JAX platform: cpu, gpu or tpu")
    p.add_argument("--preempt-at", default="0.55", help="comma-separated fractions of --steps where the job is preempted")
    p.add_argument("--worker", action="store_true", help="run one segment (set by the launcher)")
    p.add_argument("--start", type=int, default=0, help="worker: updates already done (resume if > 0)")
    p.add_argument("--stop", type=int, default=None, help="worker: checkpoint and exit after this update")
    p.add_argument("--ckpt-dir", default=None, help="worker: where checkpoints are written and read")
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


def launch(argv: list[str], args: argparse.Namespace) -> None:
    """Run the job as one worker process per segment, in a row, each resuming from the previous checkpoint."""
    cuts = sorted({int(float(f) * args.steps) for f in args.preempt_at.split(",") if f.strip()})
    bounds = [0, *[c for c in cuts if 0 < c < args.steps], args.steps]
    ckpt_dir = tempfile.mkdtemp(prefix="regress-ckpt-")
    try:
        for start, stop in zip(bounds[:-1], bounds[1:]):
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker",
                   "--start", str(start), "--stop", str(stop), "--ckpt-dir", ckpt_dir]
            rc = subprocess.run(cmd, env=dict(os.environ)).returncode
            if rc != 0:
                sys.exit(rc)
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


def save_checkpoint(ckpt_dir: Path, params: Params, opt_state: optax.OptState, meta: dict) -> None:
    """Arrays as flax msgpack (params in CHECKPOINT_DTYPE), the loop state as a pickle; atomic renames."""
    ckpt_dir.mkdir(parents=True, exist_ok=True)
    stored = jax.tree.map(lambda p: p.astype(CHECKPOINT_DTYPE), jax.device_get(params))
    blob = serialization.to_bytes({"params": stored, "opt_state": jax.device_get(opt_state)})
    for name, data in (("ckpt.msgpack", blob), ("ckpt.pkl", pickle.dumps(meta))):
        tmp = ckpt_dir / (name + ".tmp")
        tmp.write_bytes(data)
        os.replace(tmp, ckpt_dir / name)


def restore_checkpoint(ckpt_dir: Path, params: Params, opt_state: optax.OptState, device: Any) -> tuple:
    """The checkpoint restored into the freshly built (float32) state; returns (params, opt_state, meta)."""
    template = {"params": jax.device_get(params), "opt_state": jax.device_get(opt_state)}
    state = serialization.from_bytes(template, (ckpt_dir / "ckpt.msgpack").read_bytes())
    meta = pickle.loads((ckpt_dir / "ckpt.pkl").read_bytes())
    return jax.device_put(state["params"], device), jax.device_put(state["opt_state"], device), meta


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if not args.worker:
        launch(argv, args)
        return
    stop = args.steps if args.stop is None else min(args.stop, args.steps)
    ckpt_dir = Path(args.ckpt_dir or "checkpoints")
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
    params = jax.device_put(model.init(init_key, jnp.zeros((1, N_FEATURES)))["params"], device)
    opt_state = jax.device_put(tx.init(params), device)
    train_step = make_train_step(model, tx)
    eval_batch = make_eval_batch(model)

    steps_per_epoch = len(x_train) // args.batch_size
    epochs = math.ceil(args.steps / steps_per_epoch)
    step = 0
    running = jnp.zeros(())
    test_mse = float("nan")
    meta = None
    if args.start > 0:  # a restarted job: everything was built fresh above; the checkpoint overwrites it
        params, opt_state, meta = restore_checkpoint(ckpt_dir, params, opt_state, device)
        step, test_mse = meta["step"], meta["test_mse"]
        running = jnp.asarray(meta["running"], jnp.float32)
        np.random.set_state(meta["rng"])
        print(f"resumed from {ckpt_dir} at step {step}", flush=True)
    start_epoch, skip = divmod(step, steps_per_epoch)
    for epoch in range(start_epoch, epochs):
        if meta is not None and epoch == start_epoch and skip > 0:
            np.random.set_state(meta["epoch_rng"])  # redraw this epoch's permutation
        epoch_rng = np.random.get_state()
        batches = epoch_batches(x_train, y_train, args.batch_size)
        if meta is not None and epoch == start_epoch and skip > 0:
            batches = itertools.islice(batches, skip, None)  # the batches already done
        for xb, yb in batches:
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
            if step == stop:
                break
        if step == stop:
            break

    if stop < args.steps:  # end of this segment: checkpoint and hand over to the next worker
        save_checkpoint(ckpt_dir, params, opt_state,
                        {"step": step, "running": float(running), "test_mse": test_mse,
                         "epoch_rng": epoch_rng, "rng": np.random.get_state()})
        return

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
