"""Train the MLP classifier on the synthetic data set (JAX + Flax + Optax port).

Port notes: one jitted train step with fixed shapes. Data parallelism is
emulated as in the PyTorch repo: the batch is reshaped into --shards shards,
jax.vmap computes each shard's gradient separately (own dropout key), the
gradients are averaged (the all-reduce), and only the average is clipped by
global norm 1.0 before optax.adamw. optax.adamw = scale_by_adam ->
add_decayed_weights -> scale_by_learning_rate, so the decay is decoupled and
multiplied by the learning rate exactly as in torch.optim.AdamW. The schedule
is evaluated at the update count before it is incremented, so update i (from 1)
uses lr_schedule(i - 1), as torch's LambdaLR does.

Output (one line each, flushed):
  step {i} loss {loss} lr {lr}                         every 10 steps
  eval step {i} items {n} loss {loss} acc {acc}        every --eval-every steps and at the end
  metric test_acc={acc} / metric test_loss={loss}      once, at the end
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from data import N_CLASSES, N_FEATURES, make_dataset, train_batches
from model import MLP, to_torch_names

LOG_EVERY = 10
EVAL_BATCH = 512
WARMUP_FRACTION = 0.1
MIN_LR_RATIO = 0.1
CLIP_NORM = 1.0
LABEL_SMOOTHING = 0.1
BETAS = (0.9, 0.99)
EPS = 1e-8
WEIGHT_DECAY = 0.05

Params = Any


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--eval-every", type=int, default=100)
    p.add_argument("--batch-size", type=int, default=128)
    p.add_argument("--lr", type=float, default=3e-3)
    p.add_argument("--shards", type=int, default=4)
    p.add_argument("--export", default="", help="write the trained weights here (.npz, the PyTorch repo's names)")
    p.add_argument("--device", default=jax.default_backend(), help="JAX platform: cpu, gpu or tpu")
    args = p.parse_args(argv)
    if args.batch_size % args.shards:
        p.error(f"--batch-size {args.batch_size} is not divisible by --shards {args.shards}")
    return args


def make_lr_schedule(peak_lr: float, total_steps: int) -> Callable[[jax.Array | int], jax.Array]:
    """Linear warmup over the first 10% of steps, then cosine decay to MIN_LR_RATIO; count from 0."""
    warmup = max(1, int(WARMUP_FRACTION * total_steps))

    def schedule(count: jax.Array | int) -> jax.Array:
        count = jnp.asarray(count, jnp.float32)
        progress = (count - warmup) / max(1, total_steps - warmup)
        cosine = MIN_LR_RATIO + (1.0 - MIN_LR_RATIO) * 0.5 * (1.0 + jnp.cos(jnp.pi * progress))
        return peak_lr * jnp.where(count < warmup, (count + 1) / warmup, cosine)

    return schedule


def all_reduce_mean(shard_grads: Params) -> Params:
    """Average the per-shard gradients (leading axis = shard) parameter by parameter."""
    return jax.tree.map(lambda g: g.mean(axis=0), shard_grads)


def make_loss_and_grads(model: MLP, shards: int) -> Callable:
    """The batch loss and the shard-averaged gradient, as the data-parallel step computes them."""

    def shard_loss(params: Params, x: jax.Array, y: jax.Array, key: jax.Array) -> jax.Array:
        logits = model.apply({"params": params}, x, train=True, rngs={"dropout": key})
        targets = optax.smooth_labels(jax.nn.one_hot(y, N_CLASSES), LABEL_SMOOTHING)
        return optax.softmax_cross_entropy(logits, targets).mean()

    def loss_and_grads(
        params: Params, x: jax.Array, y: jax.Array, key: jax.Array
    ) -> tuple[jax.Array, Params]:
        xs = x.reshape(shards, -1, x.shape[-1])
        ys = y.reshape(shards, -1)
        keys = jax.random.split(key, shards)
        losses, shard_grads = jax.vmap(jax.value_and_grad(shard_loss), in_axes=(None, 0, 0, 0))(
            params, xs, ys, keys
        )
        return losses.mean(), all_reduce_mean(shard_grads)

    return loss_and_grads


def make_train_step(model: MLP, tx: optax.GradientTransformation, shards: int) -> Callable:
    loss_and_grads = make_loss_and_grads(model, shards)

    @jax.jit
    def train_step(
        params: Params, opt_state: optax.OptState, x: jax.Array, y: jax.Array, key: jax.Array
    ) -> tuple[Params, optax.OptState, jax.Array]:
        loss, grads = loss_and_grads(params, x, y, key)
        updates, opt_state = tx.update(grads, opt_state, params)
        return optax.apply_updates(params, updates), opt_state, loss

    return train_step


def make_eval_batch(model: MLP) -> Callable:
    @jax.jit
    def eval_batch(params: Params, x: jax.Array, y: jax.Array) -> tuple[jax.Array, jax.Array]:
        logits = model.apply({"params": params}, x, train=False)
        loss_sum = optax.softmax_cross_entropy_with_integer_labels(logits, y).sum()
        correct = (logits.argmax(axis=-1) == y).sum()
        return loss_sum, correct

    return eval_batch


def evaluate(eval_batch: Callable, params: Params, x: np.ndarray, y: np.ndarray) -> tuple[int, float, float]:
    """Plain (unsmoothed) cross-entropy and accuracy over the whole test set."""
    loss_sum, correct = jnp.zeros(()), jnp.zeros((), jnp.int32)
    for start in range(0, len(x), EVAL_BATCH):
        batch_loss, batch_correct = eval_batch(
            params, x[start : start + EVAL_BATCH], y[start : start + EVAL_BATCH]
        )
        loss_sum, correct = loss_sum + batch_loss, correct + batch_correct
    return len(x), float(loss_sum) / len(x), int(correct) / len(x)


def main(argv: list[str] | None = None) -> None:
    args = parse_args(argv)
    device = jax.devices(args.device)[0]
    init_key, dropout_key = jax.random.split(jax.random.PRNGKey(args.seed))

    x_train, y_train, x_test, y_test = make_dataset()
    model = MLP(N_FEATURES, 128, N_CLASSES, dropout=0.1)
    schedule = make_lr_schedule(args.lr, args.steps)
    tx = optax.chain(
        optax.clip_by_global_norm(CLIP_NORM),
        optax.adamw(schedule, b1=BETAS[0], b2=BETAS[1], eps=EPS, weight_decay=WEIGHT_DECAY),
    )
    with jax.default_device(device):
        params = model.init(init_key, jnp.zeros((1, N_FEATURES)), train=False)["params"]
        opt_state = tx.init(params)
    train_step = make_train_step(model, tx, args.shards)
    eval_batch = make_eval_batch(model)
    batches = train_batches(x_train, y_train, args.batch_size, seed=args.seed)

    result = (0, float("nan"), float("nan"))
    for step in range(1, args.steps + 1):
        xb, yb = next(batches)
        xb, yb = jax.device_put((xb, yb.astype(np.int32)), device)
        params, opt_state, loss = train_step(
            params, opt_state, xb, yb, jax.random.fold_in(dropout_key, step)
        )

        if step % LOG_EVERY == 0:
            lr = float(schedule(step - 1))
            print(f"step {step} loss {float(loss):.6f} lr {lr:.6g}", flush=True)
        if step % args.eval_every == 0 or step == args.steps:
            result = evaluate(eval_batch, params, x_test, y_test.astype(np.int32))
            n, eval_loss, acc = result
            print(f"eval step {step} items {n} loss {eval_loss:.6f} acc {acc:.6f}", flush=True)

    _, test_loss, test_acc = result
    print(f"metric test_acc={test_acc:.6f}", flush=True)
    print(f"metric test_loss={test_loss:.6f}", flush=True)
    if args.export:
        np.savez(args.export, **to_torch_names(params))


if __name__ == "__main__":
    main()
