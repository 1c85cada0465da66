"""Train the MLP regressor on the synthetic tabular data set (PyTorch/XLA port, config-driven).

Port notes: the hyperparameters moved into a TrainConfig (config.py) filled in three
layers, as the larger repos do: the dataclass defaults, then configs/regress.json (the
program's values: lr 0.05, momentum 0.9, weight decay 5e-4, milestones 0.5/0.75 of the
steps, gamma 0.1, batch 128, eval batch 256, hidden 64, seed 1234), then only the
command-line flags actually given (--steps, --eval-every, ...). The model, every batch
and the running loss live on the XLA device (torch_xla.device()); torch_xla.sync() cuts
and runs the graph once per step and once per evaluation batch. Shapes are fixed, so the
step graph compiles once. Host reads (.item()) happen only on logging steps and at the
end of an evaluation. Run with PJRT_DEVICE=CPU (or TPU / CUDA).

SGD with momentum 0.9 (no Nesterov) and coupled weight decay 5e-4 (added to the
gradient, as torch.optim.SGD does), MultiStepLR (x0.1 at 50% and 75% of --steps, stepped
once per optimiser step), plain MSE loss, no clipping. The program seeds itself from the
config's seed; the data loader's shuffle draws from torch's global generator (on the
host, as in the PyTorch repo).

Output (one line each, flushed):
  train step {i} loss {running mean over the last log_every steps}   every log_every steps
  eval at {i}: test_mse={mse} n={items}                              every --eval-every steps and at the end
  final test_mse={mse}                                               once, at the end
"""

from __future__ import annotations

import math

import numpy as np
import torch
import torch_xla
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from config import TrainConfig, build_parser, load_config
from data import N_FEATURES, make_dataset
from model import MLP


def parse_args(argv: list[str] | None = None) -> TrainConfig:
    flags = vars(build_parser(__doc__).parse_args(argv))
    path = flags.pop("config")
    return load_config(path, flags)


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


def main(argv: list[str] | None = None) -> None:
    cfg = parse_args(argv)
    torch.manual_seed(cfg.seed)
    np.random.seed(cfg.seed)
    device = torch_xla.device() if cfg.device == "xla" else torch.device(cfg.device)

    x_train, y_train, x_test, y_test = make_dataset()
    train_set = TensorDataset(torch.from_numpy(x_train), torch.from_numpy(y_train))
    test_set = TensorDataset(torch.from_numpy(x_test), torch.from_numpy(y_test))
    train_loader = DataLoader(train_set, batch_size=cfg.batch_size, shuffle=True, drop_last=True)
    test_loader = DataLoader(test_set, batch_size=cfg.eval_batch, shuffle=False)

    # Initialised on the host by torch's generator (as in the PyTorch repo), then moved.
    model = MLP(N_FEATURES, cfg.hidden).to(device)
    criterion = nn.MSELoss()
    optimizer = torch.optim.SGD(
        model.parameters(), lr=cfg.lr, momentum=cfg.momentum, weight_decay=cfg.weight_decay
    )
    milestones = [int(f * cfg.steps) for f in cfg.milestones]
    scheduler = torch.optim.lr_scheduler.MultiStepLR(optimizer, milestones=milestones, gamma=cfg.gamma)

    epochs = math.ceil(cfg.steps / len(train_loader))
    step = 0
    running = torch.zeros((), device=device)
    test_mse = float("nan")
    model.train()
    for epoch in range(epochs):
        for xb, yb in train_loader:
            xb, yb = xb.to(device), yb.to(device)
            optimizer.zero_grad()
            loss = criterion(model(xb), yb)
            loss.backward()
            optimizer.step()
            scheduler.step()
            step += 1
            running += loss.detach()
            torch_xla.sync()

            if step % cfg.log_every == 0:
                print(f"train step {step} loss {running.item() / cfg.log_every:.6f}", flush=True)
                running.zero_()
            if step % cfg.eval_every == 0 or step == cfg.steps:
                test_mse, n = evaluate(model, test_loader, device)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == cfg.steps:
                break

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
