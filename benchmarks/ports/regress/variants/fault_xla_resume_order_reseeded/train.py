"""Train the MLP regressor on the synthetic tabular data set (PyTorch/XLA port).

Port notes: the model, every batch and the running loss live on the XLA device
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

Preemption drill: on the preemptible TPU pool a job never runs start to end in
one process, so train.py is also its own launcher. Run without --worker it makes
a checkpoint directory and starts one worker process per segment, in a row:
the job is preempted after --preempt-at (fractions of --steps, default 0.55:
update 220 of a short run, 880 of a full one, mid-epoch), so the workers are
`sys.executable train.py <same args> --worker --start a --stop b`, with the same
environment; each worker trains updates a+1..b and, unless b is the last step,
writes a checkpoint with xm.save (moved to the CPU) and exits: model, optimizer
and MultiStepLR state dicts, the step, the running loss and the last test MSE.
The next worker seeds and builds everything as a fresh job would (the seed is a
constant, so the job is reproducible), loads the checkpoint over it, starts the
current epoch's loader again, skips the batches already done, and continues.
A worker that fails ends the launcher with its exit code.

Output (one line each, flushed):
  train step {i} loss {running mean over the last 25 steps}   every 25 steps
  eval at {i}: test_mse={mse} n={items}                       every --eval-every steps and at the end
  final test_mse={mse}                                        once, at the end
"""

from __future__ import annotations

import argparse
import itertools
import math
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch
import torch_xla
import torch_xla.core.xla_model as xm
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
    p.add_argument("--device", default="xla", help="'xla' (torch_xla.device()) or a torch device")
    p.add_argument("--preempt-at", default="0.55", help="comma-separated fractions of --steps where the job is preempted")
    p.add_argument("--worker", action="store_true", help="run one segment (set by the launcher)")
    p.add_argument("--start", type=int, default=0, help="worker: updates already done (resume if > 0)")
    p.add_argument("--stop", type=int, default=None, help="worker: checkpoint and exit after this update")
    p.add_argument("--ckpt-dir", default=None, help="worker: where checkpoints are written and read")
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


def launch(argv: list[str], args: argparse.Namespace) -> None:
    """Run the job as one worker process per segment, in a row, each resuming from the previous checkpoint."""
    cuts = sorted({int(float(f) * args.steps) for f in args.preempt_at.split(",") if f.strip()})
    bounds = [0, *[c for c in cuts if 0 < c < args.steps], args.steps]
    ckpt_dir = tempfile.mkdtemp(prefix="regress-ckpt-")
    try:
        for start, stop in zip(bounds[:-1], bounds[1:]):
            cmd = [sys.executable, str(Path(__file__).resolve()), *argv, "--worker",
                   "--start", str(start), "--stop", str(stop), "--ckpt-dir", ckpt_dir]
            rc = subprocess.run(cmd, env=dict(os.environ)).returncode
            if rc != 0:
                sys.exit(rc)
    finally:
        shutil.rmtree(ckpt_dir, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    argv = sys.argv[1:] if argv is None else list(argv)
    args = parse_args(argv)
    if not args.worker:
        launch(argv, args)
        return
    stop = args.steps if args.stop is None else min(args.stop, args.steps)
    ckpt_path = Path(args.ckpt_dir or ".") / "ckpt.pt"
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
    ckpt = None
    if args.start > 0:  # a restarted job: everything was built fresh above; the checkpoint overwrites it
        ckpt = torch.load(ckpt_path, map_location="cpu", weights_only=False)
        model.load_state_dict(ckpt["model"])
        optimizer.load_state_dict(ckpt["optimizer"])
        scheduler.load_state_dict(ckpt["scheduler"])
        step, test_mse = ckpt["step"], ckpt["test_mse"]
        running = torch.tensor(ckpt["running"], device=device)
        print(f"resumed from {ckpt_path} at step {step}", flush=True)
    start_epoch, skip = divmod(step, len(train_loader))
    model.train()
    for epoch in range(start_epoch, epochs):
        batches = iter(train_loader)
        if ckpt is not None and epoch == start_epoch:
            for _ in itertools.islice(batches, skip):  # the batches this epoch has already trained on
                pass
        for xb, yb in batches:
            xb, yb = xb.to(device), yb.to(device)
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
                test_mse, n = evaluate(model, test_loader, device)
                print(f"eval at {step}: test_mse={test_mse:.6f} n={n}", flush=True)
            if step == stop:
                break
        if step == stop:
            break

    if stop < args.steps:  # end of this segment: checkpoint and hand over to the next worker
        ckpt_path.parent.mkdir(parents=True, exist_ok=True)
        xm.save(
            {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
             "scheduler": scheduler.state_dict(), "step": step, "running": running.item(),
             "test_mse": test_mse},
            str(ckpt_path),
        )
        return

    print(f"final test_mse={test_mse:.6f}", flush=True)


if __name__ == "__main__":
    main()
