"""Train the character-level MLP language model.

    python data/names/prepare.py
    python train.py --max_iters=300 --eval_interval=100 --device=cpu --compile=False

Config values are the globals below; override them with --key=value (configurator.py).
Prints `iter N: loss L, time Tms` every log_interval iterations and
`step N: train loss A, val loss B` every eval_interval iterations (random batches, as nanoGPT does).
"""

import json
import math
import os
import time

import numpy as np
import torch

from model import CharMLP

# -----------------------------------------------------------------------------
# default config values
eval_interval = 100
log_interval = 10
eval_iters = 20
dataset = "names"
batch_size = 64
block_size = 8
n_embd = 16
n_hidden = 128
learning_rate = 3e-3
max_iters = 1200
weight_decay = 1e-2
beta1 = 0.9
beta2 = 0.99
grad_clip = 1.0
warmup_iters = 30
min_lr = 3e-4
device = "cpu"
compile = False
exec(open("configurator.py").read())  # overrides from the command line
# -----------------------------------------------------------------------------

torch.manual_seed(1337)
data_dir = os.path.join("data", dataset)
train_data = np.memmap(os.path.join(data_dir, "train.bin"), dtype=np.uint16, mode="r")
val_data = np.memmap(os.path.join(data_dir, "val.bin"), dtype=np.uint16, mode="r")
with open(os.path.join(data_dir, "meta.json")) as f:
    vocab_size = json.load(f)["vocab_size"]


def get_batch(split):
    data = train_data if split == "train" else val_data
    ix = torch.randint(len(data) - block_size, (batch_size,))
    x = torch.stack([torch.from_numpy(data[i : i + block_size].astype(np.int64)) for i in ix])
    y = torch.from_numpy(np.array([data[i + block_size] for i in ix], dtype=np.int64))
    return x.to(device), y.to(device)


model = CharMLP(vocab_size, block_size, n_embd, n_hidden).to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate, betas=(beta1, beta2),
                              weight_decay=weight_decay)
if compile:
    model = torch.compile(model)


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            _, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


def get_lr(it):
    """Linear warmup, then cosine decay to min_lr at max_iters."""
    if it < warmup_iters:
        return learning_rate * (it + 1) / (warmup_iters + 1)
    decay_ratio = (it - warmup_iters) / max(1, max_iters - warmup_iters)
    coeff = 0.5 * (1.0 + math.cos(math.pi * decay_ratio))
    return min_lr + coeff * (learning_rate - min_lr)


t0 = time.time()
iter_num = 0
while True:
    lr = get_lr(iter_num)
    for param_group in optimizer.param_groups:
        param_group["lr"] = lr
    if iter_num % eval_interval == 0:
        losses = estimate_loss()
        print(f"step {iter_num}: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
    if iter_num == max_iters:
        break
    X, Y = get_batch("train")
    _, loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(model.parameters(), grad_clip)
    optimizer.step()
    t1 = time.time()
    dt, t0 = t1 - t0, t1
    if iter_num % log_interval == 0:
        print(f"iter {iter_num}: loss {loss.item():.4f}, time {dt * 1000:.2f}ms")
    iter_num += 1
