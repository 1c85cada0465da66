"""Train the MLP regressor on the synthetic tabular data set (PyTorch/XLA port).

Port notes: the data set is small (12800 x 17 floats), so both splits are
copied to the XLA device once (torch_xla.device()) and stay there; there is no
DataLoader. Each epoch the host draws a permutation with torch.randperm from
torch's global generator (as the DataLoader's sampler does) and cuts it into
index batches of --batch-size (the last partial batch is dropped); only those
128 int64 indices travel per step, and the batch is gathered on the device
with index_select. Every index batch has the same shape, so the step graph
compiles once. The test split is evaluated in fixed slices of EVAL_BATCH rows
(its length is a multiple of it) with one torch_xla.sync() at the end of the
evaluation. The running loss stays on the device; host reads (.item()) happen
only on logging steps and at the end of an evaluation. Run with
PJRT_DEVICE=CPU (or TPU / CUDA).

SGD with momentum 0.9 (no Nesterov) and coupled weight decay 5e-4 (added to
the gradient, as torch.optim.SGD does), MultiStepLR (x0.1 at 50% and 75% of
--steps, stepped once per optimiser step), plain MSE loss, no clipping. The
program seeds itself from a constant; the per-epoch permutation draws from
torch's global generator (on the host, as in the PyTorch repo).

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Iterator

import numpy as np
import torch
import torch_xla
from torch import nn

from data import N_FEATURES, make_dataset
from model import MLP

SEED = 1234
LOG_EVERY = 25
EVAL_BATCH = 256
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
MILESTONES = (0.5, 0.75)  # fractions of --steps
GAMMA = 0.1


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--device", default="xla", help="'xla' (torch_xla.device()) or a torch device")
    return p.parse_args(argv)


@torch.no_grad()
def evaluate(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> tuple[float, int]:
    """Mean squared error over every row of the device-resident test split, in eval mode."""
    model.eval()
    sse = torch.zeros((), device=x.device)
    for start in range(0, len(x), EVAL_BATCH):
        xb, yb = x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH]
        sse += nn.functional.mse_loss(model(xb), yb, reduction="sum")
    torch_xla.sync()
    model.train()
    return sse.item() / len(x), len(x)


def index_batches(n: int, batch_size: int) -> Iterator[torch.Tensor]:
    """One epoch of shuffled index batches (host tensors); the last partial batch is dropped."""
    order = torch.randperm(n)
    for b in range(n // batch_size):
        yield order[b * batch_size : (b + 1) * batch_size]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    device = torch_xla.device() if args.device == "xla" else torch.device(args.device)

    x_train, y_train, x_test, y_test = make_dataset()
    # Both splits live on the device for the whole run.
    x_train_d, y_train_d = torch.from_numpy(x_train).to(device), torch.from_numpy(y_train).to(device)
    x_test_d, y_test_d = torch.from_numpy(x_test).to(device), torch.from_numpy(y_test).to(device)
    steps_per_epoch = len(x_train) // args.batch_size

    # Initialised on the host by torch's generator (as in the PyTorch repo), then moved.
    model = MLP(N_FEATURES, args.hidden).to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
    )
    milestones = [int(f * args.steps) for f in MILESTONES]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=GAMMA)

    epochs = math.ceil(args.steps / steps_per_epoch)
    step = 0
    running = torch.zeros((), device=device)
    test_mse = float("nan")
    model.train()
    for epoch in range(epochs):
        for idx in index_batches(len(x_train), args.batch_size):
            idx = idx.to(device)
            xb, yb = x_train_d.index_select(0, idx), y_train_d.index_select(0, idx)
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            running += loss.detach()
            torch_xla.sync()

            if step % LOG_EVERY == 0:
                print(f"train step {step} loss {running.item() / LOG_EVERY:.6f}", flush=True)
                running.zero_()
            if step % args.eval_every == 0 or step == args.steps:
                test_mse, n = evaluate(model, x_test_d, y_test_d)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
