"""Train the MLP regressor on the synthetic tabular data set (PyTorch/XLA port).

Port notes: data parallelism with torch_xla SPMD. xr.use_spmd() turns the
runtime's devices into one virtual device; a 1-d mesh ("data") spans all of
them. Parameters are replicated (the default), every batch is sharded along
its batch dimension (mark_sharding), and the compiler partitions the one
global step graph: the loss is still the mean over the whole global batch, so
the gradient each replica applies is the all-reduced mean gradient, exactly
the single-device computation. torch_xla.sync() cuts the graph once per step
and once per evaluation batch; host reads (.item()) happen only on logging
steps and at the end of an evaluation.
Run with PJRT_DEVICE=CPU CPU_NUM_DEVICES=4 (or on a TPU slice).

Learning rate: --lr is the reference's single-device rate; for data
parallelism it is scaled by the number of devices (the linear scaling rule of
the large-batch recipes: N replicas, N times the rate), lr = --lr *
xr.global_runtime_device_count(), and MultiStepLR decays that.

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
import torch_xla.distributed.spmd as xs
import torch_xla.runtime as xr
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


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--steps", type=int, default=1600)
    p.add_argument("--eval-every", type=int, default=400)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--hidden", type=int, default=64)
    return p.parse_args(argv)


def to_sharded(t: torch.Tensor, device: torch.device, mesh: xs.Mesh) -> torch.Tensor:
    """Move a host batch to the device and shard it along the batch dimension."""
    t = t.to(device)
    xs.mark_sharding(t, mesh, ("data", None))
    return t


@torch.no_grad()
def evaluate(
    model: nn.Module, loader: DataLoader, device: torch.device, mesh: xs.Mesh
) -> tuple[float, int]:
    """Mean squared error over every item of the loader, in eval mode."""
    model.eval()
    sse = torch.zeros((), device=device)
    n = 0
    for xb, yb in loader:
        xb, yb = to_sharded(xb, device, mesh), to_sharded(yb, device, mesh)
        sse += nn.functional.mse_loss(model(xb), yb, reduction="sum")
        n += len(xb)
        torch_xla.sync()
    model.train()
    return sse.item() / n, n


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    torch.manual_seed(SEED)
    np.random.seed(SEED)
    xr.use_spmd()
    device = torch_xla.device()
    n_devices = xr.global_runtime_device_count()
    mesh = xs.Mesh(np.arange(n_devices), (n_devices,), ("data",))
    if args.batch_size % n_devices or EVAL_BATCH % n_devices:
        raise SystemExit(f"batch sizes must be divisible by the {n_devices} devices")

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test_set = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    train_loader = DataLoader(train_set, batch_size=args.batch_size, shuffle=True, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=EVAL_BATCH, shuffle=False)

    # Initialised on the host by torch's generator (as in the PyTorch repo), then moved
    # (replicated over the mesh).
    model = MLP(N_FEATURES, args.hidden).to(device)
    criterion = nn.MSELoss()
    lr = args.lr * n_devices  # linear scaling rule: one replica per device
    optimizer = torch.optim.SGD(model.parameters(), lr=lr, momentum=MOMENTUM, weight_decay=WEIGHT_DECAY)
    milestones = [int(f * args.steps) for f in MILESTONES]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=GAMMA)

    epochs = math.ceil(args.steps / len(train_loader))
    step = 0
    running = torch.zeros((), device=device)
    test_mse = float("nan")
    model.train()
    for epoch in range(epochs):
        for xb, yb in train_loader:
            xb, yb = to_sharded(xb, device, mesh), to_sharded(yb, device, mesh)
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
                test_mse, n = evaluate(model, test_loader, device, mesh)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == args.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
