"""Train the tiny character GPT on the synthetic grammar corpus (JAX + Flax + Optax port).

Port notes:
  - the same numpy data, the same random windows: offsets come from numpy's global RNG
    seeded from --seed, exactly as in the PyTorch repo (so the batches are identical);
  - one jitted train step with fixed shapes (compiles once) and one jitted eval batch;
  - optimiser: optax.chain(clip_by_global_norm(0.5), adamw(schedule, b1=0.9, b2=0.95, eps=1e-8,
    weight_decay=0.1, mask=decay_mask)), where the mask selects every 2-D parameter (Dense
    kernels AND the two embeddings), as nanoGPT's configure_optimizers does. optax.adamw
    multiplies the decay by the learning rate, like torch.optim.AdamW;
  - the schedule is called with the update count before it is incremented, so update `it`
    (from 0) gets get_lr(it), as the PyTorch loop sets it by hand;
  - the loss is read to the host (float) every step for the log line, as the original's
    loss.item() is;
  - preemption: the job runs on preemptible TPU VMs, and train.py is its own launcher. Run as a
    script, it runs training as SEGMENTS = 2 processes in a row (sys.executable, this file, the
    same arguments and environment): the first trains updates 1 .. steps // 2, writes a checkpoint
    and exits; the next resumes from it and trains to the end. The checkpoint is two files in
    --ckpt-dir: a msgpack of the params and the whole optax state (Adam moments and the update
    counts, i.e. the schedule's position) by flax.serialization.to_bytes, the params stored in
    CKPT_DTYPE = bfloat16 to halve the file (the moments stay float32, the TPU computes in
    bfloat16 anyway), and a pickle of the step and numpy's global RNG state (the batch stream).
    A resumed process builds the model, a fresh params tree and a fresh optax state exactly as a
    fresh run does and restores the files into that template (from_bytes), so it continues the
    run the single process would have made. main(argv) is one segment; without --stop-at /
    --resume-from it is the whole run in one process.

Output (one line each, flushed):
  step {i} loss {loss}                        every step (i counts from 1, after the update)
  eval step {i} items {n} loss {loss}         every --eval-every steps and after the last step
  metric val_loss={loss}                      once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
import os
import pickle
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from data import make_dataset
from model import GPT, GPTConfig

BLOCK_SIZE = 32
BATCH_SIZE = 16
EVAL_BATCH = 32
EVAL_ITERS = 8
WEIGHT_DECAY = 0.1
BETAS = (0.9, 0.95)
EPS = 1e-8
GRAD_CLIP = 0.5
WARMUP_FRACTION = 0.1
MIN_LR_RATIO = 0.1
SEGMENTS = 2  # processes per run (one preemption, halfway)
CKPT_DTYPE = jnp.bfloat16  # parameters in the checkpoint file

Params = Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--ckpt-dir", default="checkpoints", help="where a segment's checkpoint is written")
    p.add_argument("--stop-at", type=int, default=-1, help="checkpoint and exit after this update (-1: run to the end)")
    p.add_argument("--resume-from", default="", help="checkpoint prefix to resume from")
    return p.parse_args(argv)


def make_schedule(total: int, peak: float) -> Callable[[jax.Array], jax.Array]:
    """nanoGPT's get_lr as a traceable function of the update count (from 0)."""
    warmup = max(1, int(WARMUP_FRACTION * total))
    min_lr = MIN_LR_RATIO * peak

    def schedule(count: jax.Array) -> jax.Array:
        it = jnp.asarray(count, jnp.float32)
        ratio = (it - warmup) / max(1, total - warmup)
        cosine = min_lr + 0.5 * (1.0 + jnp.cos(jnp.pi * ratio)) * (peak - min_lr)
        return jnp.where(it < warmup, peak * (it + 1) / (warmup + 1), cosine)

    return schedule


def decay_mask(params: Params) -> Params:
    """True for every 2-D parameter (kernels and embeddings), False for biases and LayerNorm."""
    return jax.tree.map(lambda p: p.ndim >= 2, params)


def get_batch(data: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows: offsets from numpy's global RNG (seeded in main)."""
    ix = np.random.randint(0, len(data) - BLOCK_SIZE, size=batch_size)
    x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
    y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
    return x, y


def eval_offsets(data: np.ndarray) -> np.ndarray:
    """EVAL_ITERS * EVAL_BATCH evenly spaced window offsets into the validation text."""
    return np.linspace(0, len(data) - BLOCK_SIZE - 1, EVAL_ITERS * EVAL_BATCH).astype(np.int64)


def loss_fn(model: GPT, params: Params, x: jax.Array, y: jax.Array) -> jax.Array:
    logits = model.apply({"params": params}, x)
    return optax.softmax_cross_entropy_with_integer_labels(logits, y).mean()


def make_train_step(model: GPT, tx: optax.GradientTransformation) -> Callable:
    @jax.jit
    def train_step(params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array):
        loss, grads = jax.value_and_grad(lambda p: loss_fn(model, p, x, y))(params)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def evaluate(eval_loss: Callable, params: Params, data: np.ndarray, offsets: np.ndarray) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (EVAL_ITERS batches of EVAL_BATCH)."""
    losses = []
    for k in range(EVAL_ITERS):
        ix = offsets[k * EVAL_BATCH : (k + 1) * EVAL_BATCH]
        x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
        y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
        losses.append(eval_loss(params, x, y))
    return EVAL_ITERS * EVAL_BATCH, float(jnp.stack(losses).mean())


def ckpt_prefix(args: argparse.Namespace, step: int) -> str:
    return os.path.join(args.ckpt_dir, f"seed{args.seed}_steps{args.steps}_at{step}")


def save_checkpoint(prefix: str, params: Params, opt_state: optax.OptState, step: int) -> None:
    """Params (in CKPT_DTYPE) and the optax state to msgpack; the step and numpy's RNG state to a pickle."""
    os.makedirs(os.path.dirname(prefix) or ".", exist_ok=True)
    stored = jax.tree.map(lambda p: p.astype(CKPT_DTYPE), params)
    with open(prefix + ".msgpack", "wb") as f:
        f.write(serialization.to_bytes({"params": stored, "opt_state": opt_state}))
    with open(prefix + ".host.pkl", "wb") as f:
        pickle.dump({"step": step, "numpy_rng": np.random.get_state()}, f)


def restore_checkpoint(prefix: str, params: Params, opt_state: optax.OptState):
    """(params, opt_state, step), restored into the fresh state as the template; numpy's RNG restored."""
    with open(prefix + ".msgpack", "rb") as f:
        state = serialization.from_bytes({"params": params, "opt_state": opt_state}, f.read())
    with open(prefix + ".host.pkl", "rb") as f:
        host = pickle.load(f)
    np.random.set_state(host["numpy_rng"])
    return state["params"], state["opt_state"], host["step"]


def main(argv: list[str] | None = None) -> None:
    """One segment of the run: from scratch or from --resume-from, up to --stop-at or the end."""
    args = parse_args(argv)
    np.random.seed(args.seed)
    key = jax.random.PRNGKey(args.seed)

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data)
    cfg = GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE)
    model = GPT(cfg)
    params = model.init(key, jnp.zeros((1, BLOCK_SIZE), jnp.int32))["params"]
    tx = optax.chain(
        optax.clip_by_global_norm(GRAD_CLIP),
        optax.adamw(make_schedule(args.steps, args.lr), b1=BETAS[0], b2=BETAS[1], eps=EPS,
                    weight_decay=WEIGHT_DECAY, mask=decay_mask),
    )
    opt_state = tx.init(params)
    start = 0
    if args.resume_from:
        params, opt_state, start = restore_checkpoint(args.resume_from, params, opt_state)
        print(f"resumed from {args.resume_from} at step {start}", flush=True)
    stop = args.steps if args.stop_at < 0 else min(args.stop_at, args.steps)
    train_step = make_train_step(model, tx)
    eval_loss = jax.jit(lambda p, x, y: loss_fn(model, p, x, y))

    val_loss = float("nan")
    for it in range(start, stop):
        xb, yb = get_batch(train_data, BATCH_SIZE)
        params, opt_state, loss = train_step(params, opt_state, xb.astype(np.int32), yb.astype(np.int32))

        step = it + 1
        print(f"step {step} loss {float(loss):.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            n, val_loss = evaluate(eval_loss, params, val_data.astype(np.int32), offsets)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    if stop < args.steps:
        prefix = ckpt_prefix(args, stop)
        save_checkpoint(prefix, params, opt_state, stop)
        print(f"checkpoint {prefix} written at step {stop}", flush=True)
        return
    print(f"metric val_loss={val_loss:.6f}", flush=True)


def launch(argv: list[str]) -> int:
    """The preemptible job: SEGMENTS processes in a row, each resuming from the previous one's checkpoint."""
    args = parse_args(argv)
    cmd = [sys.executable, os.path.abspath(__file__), *argv]
    prefix = ""
    for k in range(1, SEGMENTS + 1):
        stop = args.steps * k // SEGMENTS
        extra = (["--resume-from", prefix] if prefix else []) + (["--stop-at", str(stop)] if stop < args.steps else [])
        rc = subprocess.call(cmd + extra, env=os.environ.copy())
        if rc != 0:
            return rc
        prefix = ckpt_prefix(args, stop)
    return 0


if __name__ == "__main__":
    if "--stop-at" in sys.argv or "--resume-from" in sys.argv:
        main()
    else:
        sys.exit(launch(sys.argv[1:]))
