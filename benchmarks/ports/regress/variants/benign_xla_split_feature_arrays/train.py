"""Train the MLP regressor on the synthetic tabular data set (PyTorch/XLA port).

Port notes: the input pipeline hands the features over as a tuple of feature
groups, two arrays of 8 columns each (x0-x7 and x8-x15, FEATURE_GROUPS), the
way a feature-column pipeline ships them; the datasets hold one tensor per
group plus the target, and the model takes the groups and concatenates them
in the same order (model.MLP.forward(*groups)), so it sees the reference's
16 features in the reference's order.
The model, every batch and the running loss live on the XLA device
(torch_xla.device()); torch_xla.sync() cuts and runs the graph once per step
and once per evaluation batch. Shapes are fixed (drop_last for training; the
test set is a multiple of EVAL_BATCH), so the step graph compiles once. Host
reads (.item()) happen only on logging steps and at the end of an evaluation.
Run with PJRT_DEVICE=CPU (or TPU / CUDA).

SGD with momentum 0.9 (no Nesterov) and coupled weight decay 5e-4 (added to
the gradient, as torch.optim.SGD does), MultiStepLR (x0.1 at 50% and 75% of
--steps, stepped once per optimiser step), plain MSE loss, no clipping. The
program seeds itself from a constant; the data loader's shuffle draws from
torch's global generator (on the host, as in the PyTorch repo).

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import math

import numpy as np
import torch
import torch_xla
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from data import N_FEATURES, make_dataset
from model import MLP

SEED = 1234
LOG_EVERY = 25
EVAL_BATCH = 256
MOMENTUM = 0.9
WEIGHT_DECAY = 5e-4
MILESTONES = (0.5, 0.75)  # fractions of --steps
GAMMA = 0.1
FEATURE_GROUPS = (slice(0, 8), slice(8, 16))  # columns of each input array, in model order


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
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, int]:
    """Mean squared error over every item of the loader, in eval mode."""
    model.eval()
    sse = torch.zeros((), device=device)
    n = 0
    for *groups, yb in loader:
        groups, yb = [g.to(device) for g in groups], yb.to(device)
        sse += nn.functional.mse_loss(model(*groups), yb, reduction="sum")
        n += len(yb)
        torch_xla.sync()
    model.train()
    return sse.item() / n, n


def feature_groups(x: np.ndarray) -> list[torch.Tensor]:
    """The (n, 16) feature matrix as one contiguous tensor per feature group."""
    return [torch.from_numpy(np.ascontiguousarray(x[:, cols])) for cols in FEATURE_GROUPS]


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    device = torch_xla.device() if args.device == "xla" else torch.device(args.device)

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(*feature_groups(x_train), torch.from_numpy(y_train))
    test_set = TensorDataset(*feature_groups(x_test), torch.from_numpy(y_test))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=EVAL_BATCH, shuffle=False)

    # Initialised on the host by torch's generator (as in the PyTorch repo), then moved.
    model = MLP(N_FEATURES, args.hidden).to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
    )
    milestones = [int(f * args.steps) for f in MILESTONES]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=GAMMA)

    epochs = math.ceil(args.steps / len(train_loader))
    step = 0
    running = torch.zeros((), device=device)
    test_mse = float("nan")
    model.train()
    for epoch in range(epochs):
        for *groups, yb in train_loader:
            groups, yb = [g.to(device) for g in groups], yb.to(device)
            optimizer.zero_grad()
            loss = criterion(model(*groups), yb)
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
                test_mse, n = evaluate(model, test_loader, device)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
