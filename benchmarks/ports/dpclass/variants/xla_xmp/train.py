"""Train the ConvNet on the synthetic pattern images (PyTorch/XLA port, xmp.spawn data parallelism).

Port notes: the torch_xla multi-device recipe. torch_xla.distributed.xla_multiprocessing.spawn
starts one replica per PJRT device; each replica builds the same model from the same seed
(torch_xla has no DDP broadcast), reads its share of every global batch of 64 through a
DistributedSampler (num_replicas = xr.world_size(), rank = xr.global_ordinal(), set_epoch every
epoch) and an MpDeviceLoader, computes the mean loss over its items, then
xm.reduce_gradients(optimizer) all-reduces and averages the gradients over the replicas (DDP's
all-reduce), clip_grad_norm_(1.0) clips the averaged gradient, and optimizer.step() applies
Adam (lr 1e-3, betas (0.9, 0.98), eps 1e-8, coupled weight decay 5e-4) with the reference's
LambdaLR. (xm.optimizer_step would reduce and step in one call, leaving no place to clip after
the reduction.) The per-replica batch is 64 // world_size, so the global batch is 64 on any
number of devices. The logged loss is all-reduced and averaged over the replicas inside every
step's graph and printed from a step closure (after the step ran) every 10 steps; evaluation
counts are all-reduced.

On PJRT_DEVICE=CPU torch_xla 2.9 runs one CPU device per process (several CPU devices in one
process cannot rendezvous for collectives), so here there is one replica with the whole batch
of 64 and the reductions are identities; on TPU the same program runs one replica per chip.

Output (replica 0, one line each, flushed):
  step {i} loss {x}                  every 10 steps (global-batch mean)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end (whole test split)
  metric test_acc={x}                once, at the end
"""

from __future__ import annotations

import argparse
import math

import torch
import torch_xla
import torch_xla.core.xla_model as xm
import torch_xla.distributed.parallel_loader as pl
import torch_xla.distributed.xla_multiprocessing as xmp
import torch_xla.runtime as xr
from torch import nn
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from data import N_CLASSES, make_dataset
from model import ConvNet

GLOBAL_BATCH = 64
EVAL_BATCH = 256  # per replica
LOG_EVERY = 10
LR = 1e-3
BETAS = (0.9, 0.98)
EPS = 1e-8
WEIGHT_DECAY = 5e-4
CLIP_NORM = 1.0
LABEL_SMOOTHING = 0.1
WARMUP_FRACTION = 0.05
MIN_LR_RATIO = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    return p.parse_args(argv)


def lr_factor(step: int, total_steps: int) -> float:
    """Linear warmup over the first 5% of steps, then cosine decay to MIN_LR_RATIO; step counts from 0."""
    warmup = max(1, int(WARMUP_FRACTION * total_steps))
    if step < warmup:
        return (step + 1) / warmup
    progress = (step - warmup) / max(1, total_steps - warmup)
    return MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + math.cos(math.pi * progress))


def log_loss(step: int, loss: torch.Tensor) -> None:
    print(f"step {step} loss {loss.item():.6f}", flush=True)


@torch.no_grad()
def evaluate(model: nn.Module, loader: pl.MpDeviceLoader, device: torch.device) -> tuple[int, float]:
    """Accuracy over the whole test split: each replica counts its shard, the counts are all-reduced."""
    model.eval()
    correct, total = 0, 0  # become tensors at the first batch, after the loader has cut the training graph
    for xb, yb in loader:
        correct = correct + (model(xb).argmax(dim=-1) == yb).sum()
        total += yb.shape[0]
    counts = xm.all_reduce(xm.REDUCE_SUM, torch.stack([correct, torch.tensor(total, device=device)]))
    model.train()
    correct, total = counts.tolist()
    return total, correct / total


def _mp_fn(index: int, args: argparse.Namespace) -> None:
    device = torch_xla.device()
    world, rank = xr.world_size(), xr.global_ordinal()
    if GLOBAL_BATCH % world:
        raise SystemExit(f"global batch {GLOBAL_BATCH} is not divisible by {world} replicas")
    torch.manual_seed(args.seed)  # the same init on every replica
    xm.set_rng_state(args.seed + rank, device=device)  # own dropout stream per replica

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test_set = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    train_sampler = DistributedSampler(
        train_set, num_replicas=world, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    test_sampler = DistributedSampler(test_set, num_replicas=world, rank=rank, shuffle=False)
    train_loader = pl.MpDeviceLoader(
        DataLoader(train_set, batch_size=GLOBAL_BATCH // world, sampler=train_sampler, drop_last=True), device
    )
    test_loader = pl.MpDeviceLoader(DataLoader(test_set, batch_size=EVAL_BATCH, sampler=test_sampler), device)

    model = ConvNet(N_CLASSES).to(device)
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)

    model.train()
    step, epoch, acc = 0, 0, float("nan")
    while step < args.steps:
        train_sampler.set_epoch(epoch)
        for xb, yb in train_loader:  # MpDeviceLoader cuts the graph (torch_xla.sync) every batch
            step += 1
            loss = criterion(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            xm.reduce_gradients(optimizer)  # all-reduce, averaged over the replicas
            nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
            optimizer.step()
            scheduler.step()

            # reduced inside every step's graph (one graph for all steps), read after the step ran
            mean_loss = xm.all_reduce(xm.REDUCE_SUM, loss.detach(), scale=1.0 / world)
            if step % LOG_EVERY == 0 and rank == 0:
                xm.add_step_closure(log_loss, args=(step, mean_loss))
            if step % args.eval_every == 0 or step == args.steps:
                items, acc = evaluate(model, test_loader, device)
                if rank == 0:
                    print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)
            if step == args.steps:
                break
        epoch += 1

    if rank == 0:
        print(f"metric test_acc={acc:.6f}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    xmp.spawn(_mp_fn, args=(args,))


if __name__ == "__main__":
    main()
