"""Train the MLP regressor on the synthetic tabular data set (PyTorch/XLA port).

Port notes: the training loop lives in a small Trainer (trainer.py) with
callbacks, as the ported codebase grew one: the Trainer runs the optimiser
step on the XLA device (torch_xla.device()) and adds each step's loss to its
device-side MetricsCollection; the learning-rate schedule, the training log
and the evaluation are callbacks called after every step. Shapes are fixed
(drop_last for training; the test set is a multiple of EVAL_BATCH), so the
step graph compiles once per learning rate. Host reads (.item()) happen only
on logging steps and at the end of an evaluation. Run with PJRT_DEVICE=CPU
(or TPU / CUDA).

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

import numpy as np
import torch
import torch_xla
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from data import N_FEATURES, make_dataset
from model import MLP
from trainer import Callback, Trainer

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
def evaluate(model: nn.Module, loader: DataLoader, device: torch.device) -> tuple[float, int]:
    """Mean squared error over every item of the loader, in eval mode."""
    model.eval()
    sse = torch.zeros((), device=device)
    n = 0
    for xb, yb in loader:
        xb, yb = xb.to(device), yb.to(device)
        sse += nn.functional.mse_loss(model(xb), yb, reduction="sum")
        n += len(xb)
        torch_xla.sync()
    model.train()
    return sse.item() / n, n


class LRSchedulerCallback(Callback):
    """Steps a per-update learning-rate scheduler after every optimiser step."""

    def __init__(self, scheduler: torch.optim.lr_scheduler.LRScheduler) -> None:
        self.scheduler = scheduler

    def on_step_end(self, trainer: Trainer, loss: torch.Tensor) -> None:
        self.scheduler.step()


class LoggingCallback(Callback):
    """Every `every` steps: the mean training loss of the window, then a fresh window."""

    def __init__(self, every: int) -> None:
        self.every = every

    def on_step_end(self, trainer: Trainer, loss: torch.Tensor) -> None:
        if trainer.step % self.every == 0:
            print(f"train step {trainer.step} loss {trainer.metrics.compute()['loss']:.6f}", flush=True)
            trainer.metrics.reset()


class EvalCallback(Callback):
    """Test MSE every `every` steps and after the last one; the latest value in trainer.results."""

    def __init__(self, loader: DataLoader, every: int) -> None:
        self.loader = loader
        self.every = every

    def on_step_end(self, trainer: Trainer, loss: torch.Tensor) -> None:
        if trainer.step % self.every == 0 or trainer.step == trainer.max_steps:
            test_mse, n = evaluate(trainer.model, self.loader, trainer.device)
            trainer.results["test_mse"] = test_mse
            print(f"eval at {trainer.step}: test_mse={test_mse:.6f} n={n}", flush=True)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    device = torch_xla.device() if args.device == "xla" else torch.device(args.device)

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test_set = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=EVAL_BATCH, shuffle=False)

    # Initialised on the host by torch's generator (as in the PyTorch repo), then moved.
    model = MLP(N_FEATURES, args.hidden).to(device)
    optimizer = torch.optim.SGD(
        model.parameters(), lr=args.lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY
    )
    milestones = [int(f * args.steps) for f in MILESTONES]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=GAMMA)

    trainer = Trainer(
        model,
        optimizer,
        nn.MSELoss(),
        device,
        max_steps=args.steps,
        callbacks=[
            LRSchedulerCallback(scheduler),
            LoggingCallback(LOG_EVERY),
            EvalCallback(test_loader, args.eval_every),
        ],
    )
    trainer.fit(train_loader)
    print(f"final test_mse={trainer.results.get('test_mse', float('nan')):.6f}", flush=True)


if __name__ == "__main__":
    main()
