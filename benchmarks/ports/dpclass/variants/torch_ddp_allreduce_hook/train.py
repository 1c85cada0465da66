"""Data-parallel training of a small ConvNet on synthetic 16x16 pattern images (PyTorch DDP, CPU).

`python train.py [--seed N --steps N --eval-every N]` is the whole command: the program picks a
free TCP port on 127.0.0.1 and starts WORLD_SIZE=2 worker processes with
torch.multiprocessing.spawn. Each worker joins a gloo process group, wraps the model in
DistributedDataParallel and reads its own half of every global batch through a
DistributedSampler (set_epoch every epoch): per-rank batch 32, global batch 64.

The gradient all-reduce is DDP's communication hook, registered explicitly: the built-in
default_hooks.allreduce_hook (each bucket divided by the world size, then all-reduced with SUM),
the averaging DDP does by itself, spelled out at the place where a compression hook would go.

One step on every rank: forward -> cross-entropy with label smoothing 0.1 (mean over the rank's
32 items) -> backward, during which DDP all-reduces and AVERAGES the gradients -> gradient
clipping at global norm 1.0 (of the averaged gradient) -> Adam (lr 1e-3, betas (0.9, 0.98),
eps 1e-8, coupled L2 weight decay 5e-4 on every parameter) -> LambdaLR (linear warmup over the
first 5% of steps, then cosine decay to 10% of the peak; update i uses factor(i - 1)).

Output (rank 0 only, one line each, flushed):
  step {i} loss {x}                  every 10 steps; x = that step's training loss all-reduced
                                     over the ranks and averaged (= the global-batch mean)
  eval step {i} items {n} acc {x}    every --eval-every steps and at the end: the test split is
                                     sharded over the ranks, the correct/total counts all-reduced
  metric test_acc={x}                once, at the end (the last evaluation)
"""

from __future__ import annotations

import argparse
import math
import os
import socket

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch import nn
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler

from data import N_CLASSES, make_dataset
from model import ConvNet

WORLD_SIZE = 2
PER_RANK_BATCH = 32
EVAL_BATCH = 256  # per rank
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


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader) -> tuple[int, float]:
    """Accuracy over the whole test split: each rank counts its shard, the counts are all-reduced."""
    model.eval()
    counts = torch.zeros(2, dtype=torch.long)  # correct, total
    for xb, yb in loader:
        logits = model(xb)
        counts[0] += (logits.argmax(dim=-1) == yb).sum()
        counts[1] += yb.numel()
    dist.all_reduce(counts)
    model.train()
    correct, total = counts.tolist()
    return total, correct / total


def worker(rank: int, port: int, args: argparse.Namespace) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=WORLD_SIZE)
    torch.manual_seed(args.seed + rank)  # own dropout stream per rank; DDP broadcasts rank 0's init

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test_set = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    train_sampler = DistributedSampler(
        train_set, num_replicas=WORLD_SIZE, rank=rank, shuffle=True, seed=args.seed, drop_last=True
    )
    test_sampler = DistributedSampler(test_set, num_replicas=WORLD_SIZE, rank=rank, shuffle=False)
    train_loader = DataLoader(train_set, batch_size=PER_RANK_BATCH, sampler=train_sampler, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=EVAL_BATCH, sampler=test_sampler)

    model = DDP(ConvNet(N_CLASSES))
    model.register_comm_hook(state=None, hook=default_hooks.allreduce_hook)  # bucket / world, all-reduce SUM
    optimizer = torch.optim.Adam(model.parameters(), lr=LR, betas=BETAS, eps=EPS, weight_decay=WEIGHT_DECAY)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: lr_factor(s, args.steps))
    criterion = nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)

    model.train()
    step, epoch, acc = 0, 0, float("nan")
    while step < args.steps:
        train_sampler.set_epoch(epoch)
        for xb, yb in train_loader:
            step += 1
            loss = criterion(model(xb), yb)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()  # DDP: gradients all-reduced and averaged over the ranks here
            nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)
            optimizer.step()
            scheduler.step()

            if step % LOG_EVERY == 0:
                mean_loss = loss.detach().clone()
                dist.all_reduce(mean_loss)
                mean_loss /= WORLD_SIZE
                if rank == 0:
                    print(f"step {step} loss {mean_loss.item():.6f}", flush=True)
            if step % args.eval_every == 0 or step == args.steps:
                items, acc = evaluate(model.module, test_loader)
                if rank == 0:
                    print(f"eval step {step} items {items} acc {acc:.6f}", flush=True)
            if step == args.steps:
                break
        epoch += 1

    if rank == 0:
        print(f"metric test_acc={acc:.6f}", flush=True)
    dist.destroy_process_group()


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    mp.spawn(worker, args=(free_port(), args), nprocs=WORLD_SIZE, join=True)


if __name__ == "__main__":
    main()
