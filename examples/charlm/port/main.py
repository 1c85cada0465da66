"""Train charlm in JAX.

    python scripts/build_dataset.py --out data
    python main.py --num-steps 300 --eval-every 100

Logs `[step i/N] train_loss=L lr=R` every --log-every steps and one JSON line per evaluation
(`{"step": i, "train_loss": a, "val_loss": b}`, mean over --eval-batches random batches).
"""

import argparse
import json
import os

import jax
import jax.numpy as jnp
import numpy as np
import optax

from charlm.model import CharMLP

BLOCK_SIZE = 8
N_EMBD = 16
N_HIDDEN = 128
BETAS = (0.9, 0.99)
WEIGHT_DECAY = 1e-2
CLIP = 1.0


def parse_args():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--num-steps", type=int, default=1200, help="optimizer steps")
    p.add_argument("--eval-every", type=int, default=100, help="steps between evaluations")
    p.add_argument("--log-every", type=int, default=10, help="steps between training-loss lines")
    p.add_argument("--eval-batches", type=int, default=20, help="random batches per evaluation")
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=3e-3, help="peak learning rate")
    p.add_argument("--min-lr", type=float, default=3e-4)
    p.add_argument("--warmup", type=int, default=30, help="warmup steps")
    p.add_argument("--data-dir", default="data", help="where scripts/build_dataset.py wrote the arrays")
    return p.parse_args()


def schedule(args):
    """Linear warmup, then cosine decay to --min-lr at --num-steps (count = updates done so far)."""
    def lr(count):
        count = jnp.asarray(count, jnp.float32)
        warm = args.lr * (count + 1) / (args.warmup + 1)
        ratio = (count - args.warmup) / max(1, args.num_steps - args.warmup)
        cos = args.min_lr + 0.5 * (1.0 + jnp.cos(jnp.pi * ratio)) * (args.lr - args.min_lr)
        return jnp.where(count < args.warmup, warm, cos)
    return lr


def main():
    args = parse_args()
    train = np.load(os.path.join(args.data_dir, "train.npy"))
    val = np.load(os.path.join(args.data_dir, "val.npy"))
    with open(os.path.join(args.data_dir, "vocab.json")) as f:
        vocab_size = len(json.load(f))
    rng = np.random.default_rng(1337)
    offsets = np.arange(BLOCK_SIZE)

    def batch(data):
        ix = rng.integers(0, len(data) - BLOCK_SIZE, size=args.batch_size)
        return data[ix[:, None] + offsets], data[ix + BLOCK_SIZE]

    model = CharMLP(vocab_size, BLOCK_SIZE, N_EMBD, N_HIDDEN)
    params = model.init(jax.random.PRNGKey(1337), jnp.zeros((1, BLOCK_SIZE), jnp.int32))["params"]
    lr = schedule(args)
    tx = optax.chain(optax.clip_by_global_norm(CLIP),
                     optax.adamw(lr, b1=BETAS[0], b2=BETAS[1], weight_decay=WEIGHT_DECAY))
    opt_state = tx.init(params)

    def loss_fn(p, x, y):
        return optax.softmax_cross_entropy_with_integer_labels(model.apply({"params": p}, x), y).mean()

    @jax.jit
    def train_step(p, state, x, y):
        loss, grads = jax.value_and_grad(loss_fn)(p, x, y)
        updates, state = tx.update(grads, state, p)
        return optax.apply_updates(p, updates), state, loss

    eval_loss = jax.jit(loss_fn)

    def evaluate(p):
        out = {}
        for split, data in (("train", train), ("val", val)):
            out[split] = float(np.mean([eval_loss(p, *batch(data)) for _ in range(args.eval_batches)]))
        return out

    for step in range(args.num_steps + 1):
        if step % args.eval_every == 0:
            losses = evaluate(params)
            print(json.dumps({"step": step, "train_loss": round(losses["train"], 4),
                              "val_loss": round(losses["val"], 4)}), flush=True)
        if step == args.num_steps:
            break
        params, opt_state, loss = train_step(params, opt_state, *batch(train))
        if (step + 1) % args.log_every == 0:
            print(f"[step {step + 1}/{args.num_steps}] train_loss={float(loss):.4f} lr={float(lr(step)):.6f}",
                  flush=True)


if __name__ == "__main__":
    main()
