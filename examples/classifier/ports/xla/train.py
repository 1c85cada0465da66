"""Train the MLP classifier on the synthetic data set (PyTorch/XLA port).

Port notes: the model and every tensor of the step live on the XLA device
(torch_xla.device()); torch_xla.sync() cuts and runs the graph once per step
and once per evaluation batch. Shapes are fixed (full batches only, the test
set is a multiple of EVAL_BATCH), so the step graph compiles once. Host reads
(.item()) happen only on logging steps and at the end of an evaluation.
Run with PJRT_DEVICE=CPU (or TPU / CUDA).

Data parallelism is emulated on one device: each batch is split into --shards
equal shards, every shard's gradient is computed on its own (as one replica
would), the gradients are averaged (the all-reduce), and only the averaged
gradient is clipped before the optimiser step.

Output (one line each, flushed):
  step {i} loss {loss} lr {lr}                         every 10 steps
  eval step {i} items {n} loss {loss} acc {acc}        every --eval-every steps and at the end
  metric test_acc={acc} / metric test_loss={loss}      once, at the end
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
from torch import nn

from data import N_CLASSES, N_FEATURES, make_dataset, train_batches
from model import MLP

LOG_EVERY = 10
EVAL_BATCH = 512
WARMUP_FRACTION = 0.1
MIN_LR_RATIO = 0.1
CLIP_NORM = 1.0
LABEL_SMOOTHING = 0.1
BETAS = (0.9, 0.99)
EPS = 1e-8
WEIGHT_DECAY = 0.05


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--export", default="", help="write the trained weights here (.npz, the PyTorch repo's names)")
    p.add_argument("--device", default="xla", help="'xla' (torch_xla.device()) or a torch device")
    args = p.parse_args(argv)
    if args.batch_size % args.shards:
        p.error(f"--batch-size {args.batch_size} is not divisible by --shards {args.shards}")
    return args


def lr_factor(step: int, total_steps: int) -> float:
    """Linear warmup over the first 10% of steps, then cosine decay to MIN_LR_RATIO; step counts from 0."""
    warmup = max(1, int(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))


def shard_gradients(
    model: nn.Module, criterion: nn.Module, x: torch.Tensor, y: torch.Tensor, shards: int
) -> tuple[list[list[torch.Tensor]], torch.Tensor]:
    """Each shard's gradient computed separately, as each data-parallel replica would; and the batch loss."""
    params = [p for p in model.parameters() if p.requires_grad]
    grads, losses = [], []
    for xs, ys in zip(x.chunk(shards), y.chunk(shards)):
        loss = criterion(model(xs), ys)
        grads.append(list(torch.autograd.grad(loss, params)))
        losses.append(loss.detach())
    return grads, torch.stack(losses).mean()


def all_reduce_mean(shard_grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
    """Average the per-shard gradients parameter by parameter."""
    return [torch.stack(per_param).mean(dim=0) for per_param in zip(*shard_grads)]


@torch.no_grad()
def evaluate(
    model: nn.Module, x: np.ndarray, y: np.ndarray, device: torch.device
) -> tuple[int, float, float]:
    """Plain (unsmoothed) cross-entropy and accuracy over the whole test set."""
    model.eval()
    loss_sum = torch.zeros((), device=device)
    correct = torch.zeros((), device=device, dtype=torch.long)
    for start in range(0, len(x), EVAL_BATCH):
        xb = torch.from_numpy(x[start : start + EVAL_BATCH]).to(device)
        yb = torch.from_numpy(y[start : start + EVAL_BATCH]).to(device)
        logits = model(xb)
        loss_sum += nn.functional.cross_entropy(logits, yb, reduction="sum")
        correct += (logits.argmax(dim=-1) == yb).sum()
        torch_xla.sync()
    model.train()
    return len(x), loss_sum.item() / len(x), correct.item() / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(args.seed)
    device = torch_xla.device() if args.device == "xla" else torch.device(args.device)
    # Dropout on the XLA device draws from XLA's own generator, not torch's.
    xm.set_rng_state(args.seed, device=device)

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, 128, N_CLASSES, dropout=0.1).to(device)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=args.lr, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY
    )
    scheduler = torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda s: lr_factor(s, args.steps)
    )
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)
    batches = train_batches(x_train, y_train, args.batch_size, seed=args.seed)

    model.train()
    result = (0, float("nan"), float("nan"))
    for step in range(1, args.steps + 1):
        xb_np, yb_np = next(batches)
        xb = torch.from_numpy(xb_np).to(device)
        yb = torch.from_numpy(yb_np).to(device)

        shard_grads, loss = shard_gradients(model, criterion, xb, yb, args.shards)
        for p, g in zip(model.parameters(), all_reduce_mean(shard_grads)):
            p.grad = g
        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
        lr = scheduler.get_last_lr()[0]
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        scheduler.step()
        torch_xla.sync()

        if step % LOG_EVERY == 0:
            print(f"step {step} loss {loss.item():.6f} lr {lr:.6g}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            result = evaluate(model, x_test, y_test, device)
            n, eval_loss, acc = result
            print(f"eval step {step} items {n} loss {eval_loss:.6f} acc {acc:.6f}", flush=True)

    _, test_loss, test_acc = result
    print(f"metric test_acc={test_acc:.6f}", flush=True)
    print(f"metric test_loss={test_loss:.6f}", flush=True)
    if args.export:
        np.savez(args.export, **{k: v.detach().cpu().numpy() for k, v in model.state_dict().items()})


if __name__ == "__main__":
    main()
