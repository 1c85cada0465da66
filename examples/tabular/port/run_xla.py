"""Fit the census outcome model with PyTorch/XLA.

    python tools/make_features.py --out features
    PJRT_DEVICE=CPU python run_xla.py --num-epochs 20

The model and every batch live on the XLA device; torch_xla.sync() runs one graph per step; the epoch's
training loss is summed on the device and read once per epoch. Shapes are fixed (full batches only,
whole-split evaluation), so each graph compiles once. One JSON line per epoch, the test accuracy at the end.
"""

import argparse
import json
import os

import numpy as np
import torch
import torch_xla
from torch import nn

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--num-epochs", type=int, default=60)
p.add_argument("--bs", type=int, default=128, help="batch size")
p.add_argument("--learning-rate", type=float, default=1e-3)
p.add_argument("--features", default="features", help="where tools/make_features.py wrote the arrays")
args = p.parse_args()

np.random.seed(0)
torch.manual_seed(0)
device = torch_xla.device()


def load(name):
    x = torch.from_numpy(np.load(os.path.join(args.features, f"{name}_x.npy")))
    y = torch.from_numpy(np.load(os.path.join(args.features, f"{name}_y.npy")))
    return x, y


x_train, y_train = load("train")
held_out = {name: tuple(t.to(device) for t in load(name)) for name in ("val", "test")}
hidden = 64
model = nn.Sequential(nn.Linear(x_train.shape[1], hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                      nn.Linear(hidden, 1)).to(device)
optimizer = torch.optim.Adam(model.parameters(), lr=args.learning_rate)
criterion = nn.BCEWithLogitsLoss()


@torch.no_grad()
def evaluate(name):
    x, y = held_out[name]
    logits = model(x).squeeze(1)
    loss, acc = criterion(logits, y), ((logits > 0).float() == y).float().mean()
    torch_xla.sync()
    return loss.item(), acc.item()


for epoch in range(1, args.num_epochs + 1):
    order = np.random.permutation(len(x_train))
    total, batches = torch.zeros((), device=device), 0
    for start in range(0, len(order) - args.bs + 1, args.bs):
        idx = torch.from_numpy(order[start : start + args.bs])
        xb, yb = x_train[idx].to(device), y_train[idx].to(device)
        loss = criterion(model(xb).squeeze(1), yb)
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.detach()
        batches += 1
        torch_xla.sync()
    val_loss, val_acc = evaluate("val")
    print(json.dumps({"epoch": epoch, "loss": round(total.item() / batches, 4), "val_loss": round(val_loss, 4),
                      "val_acc": round(val_acc, 4)}), flush=True)
print(f"FINAL test_acc={evaluate('test')[1]:.4f}")
