"""Train a tiny character-level GPT on the synthetic grammar corpus (PyTorch/XLA port, preemptible).

Port notes: the model, every batch and the optimiser state live on the XLA device
(torch_xla.device()); torch_xla.sync() cuts and runs the graph once per training step
and once per evaluation batch. Shapes are fixed (every batch is BATCH_SIZE x BLOCK_SIZE,
every evaluation batch EVAL_BATCH x BLOCK_SIZE), so each graph compiles once; the
learning rate set in the param groups is a Python float, which torch_xla passes to the
graph as data, not as a constant. The loss is read to the host with .item() every step
for the log line, as in the original. Run with PJRT_DEVICE=CPU (or TPU / CUDA).

Preemption: the job runs on preemptible TPU VMs, and train.py is its own launcher. Run as a
script, it runs training as SEGMENTS = 2 processes in a row (sys.executable, this file, the same
arguments and environment): the first trains updates 1 .. steps // 2, writes a checkpoint and
exits; the next resumes from it and trains to the end. The checkpoint (xm.save: every tensor
moved to the host first) holds the model's state_dict, the optimiser's state_dict (the AdamW
moments and per-parameter step counts of both groups), the number of updates done (which is
the schedule's position) and the RNG states (torch's CPU generator and the XLA device's, as
torch_xla's checkpointing examples keep them). A resumed process seeds itself from --seed as
every run does, rebuilds the model and the optimiser exactly as a fresh one does, then loads
all of it and restores the RNG states, so it continues the run the single process would have made. main(argv) is one
segment; without --stop-at / --resume-from it is the whole run in one process.

Habits kept from nanoGPT-like repos:
  - batches are random windows whose offsets come from numpy's global RNG, seeded from --seed;
  - the training loss is read back with .item() and printed EVERY step;
  - AdamW with two parameter groups (weight decay on every 2-D weight, embeddings included;
    none on biases and LayerNorm), betas (0.9, 0.95), gradient clipping at global norm 0.5;
  - the learning rate is set by hand in each param group every step: linear warmup over the
    first 10% of the steps, then cosine decay to a tenth of the peak;
  - a periodic evaluation over a fixed number of batches of the held-out split, and a final one.

Evaluation windows are fixed (evenly spaced offsets into the validation text), so every
evaluation sees the same EVAL_ITERS x EVAL_BATCH sequences.

Output (one line each, flushed):
  step {i} loss {loss}                        every step (i counts from 1, after the update)
  eval step {i} items {n} loss {loss}         every --eval-every steps and after the last step
  metric val_loss={loss}                      once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
import math
import os
import subprocess
import sys

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
    p.add_argument("--device", default="xla", help="'xla' (torch_xla.device()) or a torch device")
    p.add_argument("--ckpt-dir", default="checkpoints", help="where a segment's checkpoint is written")
    p.add_argument("--stop-at", type=int, default=-1, help="checkpoint and exit after this update (-1: run to the end)")
    p.add_argument("--resume-from", default="", help="checkpoint to resume from")
    return p.parse_args(argv)


def get_lr(it: int, total: int, peak: float) -> float:
    """nanoGPT's schedule for update `it` (from 0): linear warmup, then cosine decay to MIN_LR_RATIO * peak."""
    warmup = max(1, int(WARMUP_FRACTION * total))
    min_lr = MIN_LR_RATIO * peak
    if it < warmup:
        return peak * (it + 1) / (warmup + 1)
    ratio = (it - warmup) / max(1, total - warmup)
    coeff = 0.5 * (1.0 + math.cos(math.pi * ratio))
    return min_lr + coeff * (peak - min_lr)


def get_batch(data: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
    """Random windows: offsets from numpy's global RNG (seeded in main)."""
    ix = np.random.randint(0, len(data) - BLOCK_SIZE, size=batch_size)
    x = np.stack([data[i : i + BLOCK_SIZE] for i in ix])
    y = np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])
    return x, y


def eval_offsets(data: np.ndarray) -> np.ndarray:
    """EVAL_ITERS * EVAL_BATCH evenly spaced window offsets into the validation text."""
    return np.linspace(0, len(data) - BLOCK_SIZE - 1, EVAL_ITERS * EVAL_BATCH).astype(np.int64)


@torch.no_grad()
def evaluate(model: GPT, data: np.ndarray, offsets: np.ndarray, device: torch.device) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (EVAL_ITERS batches of EVAL_BATCH)."""
    model.eval()
    losses = []
    for k in range(EVAL_ITERS):
        ix = offsets[k * EVAL_BATCH : (k + 1) * EVAL_BATCH]
        x = torch.from_numpy(np.stack([data[i : i + BLOCK_SIZE] for i in ix])).to(device)
        y = torch.from_numpy(np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix])).to(device)
        _, loss = model(x, y)
        losses.append(loss)
        torch_xla.sync()
    model.train()
    return EVAL_ITERS * EVAL_BATCH, torch.stack(losses).mean().item()


def save_checkpoint(path: str, model: GPT, optimizer: torch.optim.Optimizer, step: int) -> None:
    """Everything a resumed process needs: weights, AdamW state, the update count, the RNG states."""
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step,
             "torch_rng": torch.get_rng_state(), "xla_rng": xm.get_rng_state()}
    xm.save(state, path)  # moves the XLA tensors to the host, then torch.save


def main(argv: list[str] | None = None) -> None:
    """One segment of the run: from scratch or from --resume-from, up to --stop-at or the end."""
    args = parse_args(argv)
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch_xla.device() if args.device == "xla" else torch.device(args.device)

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data)
    cfg = GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE)
    model = GPT(cfg).to(device)
    optimizer = model.configure_optimizers(WEIGHT_DECAY, args.lr, BETAS, EPS)
    start = 0
    if args.resume_from:
        state = torch.load(args.resume_from, map_location="cpu", weights_only=False)
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])  # moments go to their parameter's device
        torch.set_rng_state(state["torch_rng"])
        xm.set_rng_state(state["xla_rng"])
        start = state["step"]
        print(f"resumed from {args.resume_from} at step {start}", flush=True)
    stop = args.steps if args.stop_at < 0 else min(args.stop_at, args.steps)

    model.train()
    val_loss = float("nan")
    for it in range(start, stop):
        lr = get_lr(it, args.steps, args.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        xb, yb = get_batch(train_data, BATCH_SIZE)
        x, y = torch.from_numpy(xb).to(device), torch.from_numpy(yb).to(device)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        torch_xla.sync()

        step = it + 1
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            n, val_loss = evaluate(model, val_data, offsets, device)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    if stop < args.steps:
        path = os.path.join(args.ckpt_dir, f"seed{args.seed}_steps{args.steps}_at{stop}.pt")
        save_checkpoint(path, model, optimizer, stop)
        print(f"checkpoint {path} written at step {stop}", flush=True)
        return
    print(f"metric val_loss={val_loss:.6f}", flush=True)


def launch(argv: list[str]) -> int:
    """The preemptible job: SEGMENTS processes in a row, each resuming from the previous one's checkpoint."""
    args = parse_args(argv)
    cmd = [sys.executable, os.path.abspath(__file__), *argv]
    bounds = [args.steps * k // SEGMENTS for k in range(1, SEGMENTS + 1)]
    ckpt = ""
    for k, stop in enumerate(bounds):
        extra = (["--resume-from", ckpt] if ckpt else []) + (["--stop-at", str(stop)] if stop < args.steps else [])
        rc = subprocess.call(cmd + extra, env=os.environ.copy())
        if rc != 0:
            return rc
        ckpt = os.path.join(args.ckpt_dir, f"seed{args.seed}_steps{args.steps}_at{stop}.pt")
    return 0


if __name__ == "__main__":
    if "--stop-at" in sys.argv or "--resume-from" in sys.argv:
        main()
    else:
        sys.exit(launch(sys.argv[1:]))
