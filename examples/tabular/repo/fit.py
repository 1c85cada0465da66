"""Fit the outcome model on the census table.

    python scripts/download.py && python scripts/preprocess.py
    python fit.py --epochs 20

Prints one line per epoch (the mean training loss of the epoch, then the validation loss and accuracy)
and the test accuracy at the end.
"""

import argparse

import numpy as np
import torch
from torch import nn

from model import make_model

p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
p.add_argument("--epochs", type=int, default=60)
p.add_argument("--batch-size", type=int, default=128)
p.add_argument("--lr", type=float, default=1e-3)
p.add_argument("--data-dir", default="data/processed")
args = p.parse_args()

np.random.seed(0)
torch.manual_seed(0)
split = {name: np.load(f"{args.data_dir}/{name}.npz") for name in ("train", "val", "test")}
x_train, y_train = torch.from_numpy(split["train"]["x"]), torch.from_numpy(split["train"]["y"])
model = make_model(x_train.shape[1])
optimizer = torch.optim.Adam(model.parameters(), lr=args.lr)
criterion = nn.BCEWithLogitsLoss()


@torch.no_grad()
def evaluate(name):
    x, y = torch.from_numpy(split[name]["x"]), torch.from_numpy(split[name]["y"])
    logits = model(x).squeeze(1)
    return criterion(logits, y).item(), ((logits > 0).float() == y).float().mean().item()


for epoch in range(1, args.epochs + 1):
    order = np.random.permutation(len(x_train))
    total, batches = 0.0, 0
    for start in range(0, len(order) - args.batch_size + 1, args.batch_size):
        idx = torch.from_numpy(order[start : start + args.batch_size])
        loss = criterion(model(x_train[idx]).squeeze(1), y_train[idx])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        total += loss.item()
        batches += 1
    val_loss, val_acc = evaluate("val")
    print(f"Epoch {epoch}/{args.epochs} - train_loss: {total / batches:.4f} - val_loss: {val_loss:.4f} - "
          f"val_acc: {val_acc:.4f}", flush=True)
print(f"Test accuracy: {evaluate('test')[1]:.4f}")
