"""Train a tiny character-level GPT on the synthetic grammar corpus (PyTorch/XLA SPMD port, FSDP-style).

Port notes: SPMD with fully sharded parameters (torch_xla.distributed.spmd, the FSDPv2 recipe
written out by hand): a 1-D mesh over every device ('fsdp' = N). Each batch is sharded along
its rows over 'fsdp', and every parameter is sharded along its FIRST dimension over the same
axis (xs.mark_sharding(p, mesh, ('fsdp', None)) for a 2-D weight, ('fsdp',) for a bias or a
LayerNorm vector; every dimension here divides by 4), right after model.to(device) and before
the optimiser is built, so AdamW's moments, created lazily as zeros_like(p) on the device, are
laid out like their parameters. The program is still written for one logical device: XLA's
partitioner gathers each weight where it is used and reduce-scatters its gradient, so the
loss is the global batch mean and clipping (the global norm over the sharded gradients) and
AdamW compute what one device computes; only the summation order of the sharded reductions
changes. On a CPU: PJRT_DEVICE=CPU CPU_NUM_DEVICES=4. torch_xla.sync() cuts and runs the graph
once per training step and once per evaluation batch; shapes and shardings are fixed, so each
graph compiles once. The loss is read to the host with .item() every step, as in the original.

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

import numpy as np
import torch
import torch_xla
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr

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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=1337)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--lr", type=float, default=2e-3)
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


def to_device(a: np.ndarray, device: torch.device, mesh: xs.Mesh) -> torch.Tensor:
    """A (batch, time) array on the device, its rows sharded over the mesh's 'fsdp' axis."""
    t = torch.from_numpy(a).to(device)
    xs.mark_sharding(t, mesh, ("fsdp", None))
    return t


def shard_parameters(model: torch.nn.Module, mesh: xs.Mesh) -> int:
    """FSDP layout: every parameter split along its first dimension over 'fsdp' (the rest replicated).

    Returns the number of sharded tensors. A tensor whose first dimension does not divide by the
    mesh size would stay replicated; in this model every one divides."""
    n_dev, sharded = mesh.size(), 0
    for _, p in model.named_parameters():
        if p.shape[0] % n_dev:
            continue
        xs.mark_sharding(p, mesh, ("fsdp",) + (None,) * (p.dim() - 1))
        sharded += 1
    return sharded


@torch.no_grad()
def evaluate(model: GPT, data: np.ndarray, offsets: np.ndarray, device: torch.device,
             mesh: xs.Mesh) -> tuple[int, float]:
    """Mean token cross-entropy over the fixed evaluation windows (EVAL_ITERS batches of EVAL_BATCH)."""
    model.eval()
    losses = []
    for k in range(EVAL_ITERS):
        ix = offsets[k * EVAL_BATCH : (k + 1) * EVAL_BATCH]
        x = to_device(np.stack([data[i : i + BLOCK_SIZE] for i in ix]), device, mesh)
        y = to_device(np.stack([data[i + 1 : i + 1 + BLOCK_SIZE] for i in ix]), device, mesh)
        _, loss = model(x, y)
        losses.append(loss)
        torch_xla.sync()
    model.train()
    return EVAL_ITERS * EVAL_BATCH, torch.stack(losses).mean().item()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    xr.use_spmd()
    n_dev = xr.global_runtime_device_count()
    if BATCH_SIZE % n_dev or EVAL_BATCH % n_dev:
        raise SystemExit(f"batch sizes {BATCH_SIZE}, {EVAL_BATCH} do not split over {n_dev} devices")
    mesh = xs.Mesh(np.arange(n_dev), (n_dev,), ("fsdp",))
    np.random.seed(args.seed)
    torch.manual_seed(args.seed)
    device = torch_xla.device()

    train_data, val_data, vocab = make_dataset()
    offsets = eval_offsets(val_data)
    cfg = GPTConfig(vocab_size=len(vocab), block_size=BLOCK_SIZE)
    model = GPT(cfg).to(device)
    n_sharded = shard_parameters(model, mesh)
    assert n_sharded == len(list(model.parameters())), "every parameter is sharded in this model"
    optimizer = model.configure_optimizers(WEIGHT_DECAY, args.lr, BETAS, EPS)

    model.train()
    val_loss = float("nan")
    for it in range(args.steps):
        lr = get_lr(it, args.steps, args.lr)
        for group in optimizer.param_groups:
            group["lr"] = lr
        xb, yb = get_batch(train_data, BATCH_SIZE)
        x, y = to_device(xb, device, mesh), to_device(yb, device, mesh)
        _, loss = model(x, y)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), GRAD_CLIP)
        optimizer.step()
        torch_xla.sync()

        step = it + 1
        print(f"step {step} loss {loss.item():.6f}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            n, val_loss = evaluate(model, val_data, offsets, device, mesh)
            print(f"eval step {step} items {n} loss {val_loss:.6f}", flush=True)

    print(f"metric val_loss={val_loss:.6f}", flush=True)


if __name__ == "__main__":
    main()
