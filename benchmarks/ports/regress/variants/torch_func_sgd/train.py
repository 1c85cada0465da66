"""Train the MLP regressor on the synthetic tabular data set (functional PyTorch port).

Port notes: the training step is written with torch.func: the loss is a pure
function of a parameter dict (functional_call on the MLP), its gradient comes
from grad_and_value, and torch.optim.SGD(momentum=0.9, weight_decay=5e-4) is
written out by hand with one momentum buffer per parameter, as torch's SGD
does it: d = g + wd * p (coupled decay), buf = d on the first update and
buf = 0.9 * buf + d after (dampening 0, no Nesterov), p -= lr * buf.
MultiStepLR (x0.1 at 50% and 75% of --steps) is the rate
base * 0.1 ** #(milestones <= updates taken so far), i.e. the value torch's
scheduler holds at each update. The parameter dict holds detached views of
the model's own parameters, so the in-place updates are the model's and the
evaluation calls the model as usual. Plain MSE loss, no clipping. The program
seeds itself from a constant; the data loader's shuffle draws from torch's
global generator.

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
from torch import nn
from torch.func import functional_call, grad_and_value
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    p.add_argument("--device", default="cpu")
    return p.parse_args(argv)


@torch.no_grad()
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, int]:
    """Mean squared error over every item of the loader, in eval mode."""
    model.eval()
    sse = torch.zeros((), device=device)
    n = 0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        sse += nn.functional.mse_loss(model(xb), yb, reduction="sum")
        n += len(xb)
    model.train()
    return sse.item() / n, n


def multistep_lr(base_lr: float, milestones: list[int], updates_done: int) -> float:
    """MultiStepLR's rate for the next update, after `updates_done` scheduler steps."""
    return base_lr * GAMMA ** sum(updates_done >= m for m in milestones)


@torch.no_grad()
def sgd_update(
    params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor], bufs: dict[str, torch.Tensor], lr: float
) -> None:
    """torch.optim.SGD(momentum, weight_decay, dampening=0, nesterov=False), in place."""
    for name, p in params.items():
        d = grads[name].add(p, alpha=WEIGHT_DECAY)
        if name not in bufs:
            bufs[name] = d.clone()
        else:
            bufs[name].mul_(MOMENTUM).add_(d)
        p.add_(bufs[name], alpha=-lr)


def make_train_step(model: nn.Module):
    """One functional step: loss and gradients of the parameter dict, then the hand-written SGD update."""

    def loss_fn(params: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        return nn.functional.mse_loss(functional_call(model, params, (xb,)), yb)

    loss_and_grads = grad_and_value(loss_fn)

    def train_step(
        params: dict[str, torch.Tensor], bufs: dict[str, torch.Tensor], xb: torch.Tensor, yb: torch.Tensor, lr: float
    ) -> torch.Tensor:
        grads, loss = loss_and_grads(params, xb, yb)
        sgd_update(params, grads, bufs, lr)
        return loss

    return train_step


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    device = torch.device(args.device)

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test_set = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=EVAL_BATCH, shuffle=False)

    model = MLP(N_FEATURES, args.hidden).to(device)
    params = {name: p.detach() for name, p in model.named_parameters()}  # views: updated in place
    bufs: dict[str, torch.Tensor] = {}
    milestones = [int(f * args.steps) for f in MILESTONES]
    train_step = make_train_step(model)

    epochs = math.ceil(args.steps / len(train_loader))
    step = 0
    running = torch.zeros((), device=device)
    test_mse = float("nan")
    model.train()
    for epoch in range(epochs):
        for xb, yb in train_loader:
            xb, yb = xb.to(device), yb.to(device)
            loss = train_step(params, bufs, xb, yb, multistep_lr(args.lr, milestones, step))
            step += 1

            running += loss.detach()
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
