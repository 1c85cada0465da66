"""The detection benchmark's cases: faithful ports, benign differences and silent faults.

Each mutant is a list of exact text edits of a copy of examples/classifier/repo. An edit must match
the expected number of times and must change the program's syntax tree (not only a comment or
whitespace), or the benchmark stops: a mutant that silently failed to apply would count as "not
flagged" and flatter the false-alarm rate or sink the recall for the wrong reason.
"""

from __future__ import annotations

import ast
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

Kind = Literal["faithful", "benign", "fault"]


@dataclass(frozen=True)
class Edit:
    file: str
    old: str
    new: str
    count: int = 1  # how many times `old` must occur (all are replaced)


@dataclass(frozen=True)
class Case:
    name: str
    kind: Kind
    what: str
    profile: str = "target"  # "target" runs a mutant of the repo; "xla"/"jax" run a port as it is
    port: str | None = None  # examples/classifier/ports/<port>
    edits: list[Edit] = field(default_factory=list)
    held_out: int = 0  # 0: the suite the protocol was tuned on; 1, 2: held-out sets (see below)


PER_SHARD_CLIP = Edit(
    "train.py",
    "        grads.append(list(torch.autograd.grad(loss, params)))\n",
    "        g = list(torch.autograd.grad(loss, params))\n"
    "        norm = torch.sqrt(sum((t * t).sum() for t in g))\n"
    "        grads.append([t * torch.clamp(CLIP_NORM / (norm + 1e-6), max=1.0) for t in g])\n",
)
NO_GLOBAL_CLIP = Edit("train.py", "        nn.utils.clip_grad_norm_(model.parameters(), CLIP_NORM)\n", "")
def init_edit(what: str, weight_init: str) -> Edit:
    """Re-initialise every Linear of the MLP: `weight_init` on its weight, zero bias."""
    line = "        self.dropout = nn.Dropout(dropout)\n"
    return Edit("model.py", line, line + f"        for layer in (self.fc1, self.fc2, self.head):  # {what}, zero bias\n"
                f"            {weight_init}\n            nn.init.zeros_(layer.bias)\n")


LECUN_INIT = init_edit("flax's default: lecun_normal",
                       "nn.init.trunc_normal_(layer.weight, std=layer.in_features ** -0.5)")

CASES: list[Case] = [
    Case("repo_other_seed", "faithful", "the unmodified repo at seeds the baseline never saw"),
    Case("port_xla", "faithful", "the PyTorch/XLA port (PJRT CPU)", profile="xla", port="xla"),
    Case("port_jax", "faithful", "the JAX/optax port (CPU)", profile="jax", port="jax"),
    Case("shuffle_order", "benign", "another shuffling algorithm (argsort of uniforms)",
         edits=[Edit("data.py", "order = rng.permutation(len(x))", "order = np.argsort(rng.random(len(x)))")]),
    Case("init_lecun", "benign", "another init distribution (flax's lecun_normal, zero bias)", edits=[LECUN_INIT]),
    Case("layernorm_eps", "benign", "LayerNorm eps 1e-6 (flax) instead of 1e-5 (torch)",
         edits=[Edit("model.py", "nn.LayerNorm(hidden)", "nn.LayerNorm(hidden, eps=1e-6)", count=2)]),
    Case("clip_per_shard", "fault", "gradients clipped per shard before the 4-shard average",
         edits=[PER_SHARD_CLIP, NO_GLOBAL_CLIP]),
    Case("weight_decay_default", "fault", "weight decay 1e-4 (optax.adamw's default) instead of 0.05",
         edits=[Edit("train.py", "WEIGHT_DECAY = 0.05", "WEIGHT_DECAY = 1e-4")]),
    Case("no_warmup", "fault", "learning-rate warmup dropped",
         edits=[Edit("train.py", "WARMUP_FRACTION = 0.1", "WARMUP_FRACTION = 0.0")]),
    Case("dropout_inactive", "fault", "dropout never active (rate 0 in training)",
         edits=[Edit("train.py", "dropout=0.1).to(device)", "dropout=0.0).to(device)")]),
    Case("no_label_smoothing", "fault", "label smoothing dropped",
         edits=[Edit("train.py", "nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)", "nn.CrossEntropyLoss()")]),
    Case("loss_summed", "fault", "per-shard loss summed instead of averaged",
         edits=[Edit("train.py", "nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING)",
                     'nn.CrossEntropyLoss(label_smoothing=LABEL_SMOOTHING, reduction="sum")')]),
    Case("eval_on_train", "fault", "evaluation on the training split",
         edits=[Edit("train.py", "result = evaluate(model, x_test, y_test, device)",
                     "result = evaluate(model, x_train, y_train, device)")]),
    Case("adam_betas", "fault", "Adam betas (0.9, 0.999) (the framework default) instead of (0.9, 0.99)",
         edits=[Edit("train.py", "BETAS = (0.9, 0.99)", "BETAS = (0.9, 0.999)")]),
]


# Held-out set 1: written after the gradient-norm floor was set from the first sweep, run once with that
# protocol. It then motivated two changes (margins, the scale-free gradient norm), so it is spent.
# Held-out set 2: written after those changes, before any run of it.
HE_INIT = init_edit("He normal", 'nn.init.kaiming_normal_(layer.weight, nonlinearity="relu")')
CASES += [
    Case("init_he_normal", "benign", "another init distribution (He normal, zero bias)", edits=[HE_INIT],
         held_out=1),
    Case("eval_batch_256", "benign", "evaluation batch 256 instead of 512 (same items, another summation order)",
         edits=[Edit("train.py", "EVAL_BATCH = 512", "EVAL_BATCH = 256")], held_out=1),
    Case("grads_summed", "fault", "the all-reduce sums the shards' gradients instead of averaging them",
         edits=[Edit("train.py", "torch.stack(per_param).mean(dim=0)", "torch.stack(per_param).sum(dim=0)")],
         held_out=1),
    Case("lr_linear_decay", "fault", "linear learning-rate decay instead of cosine",
         edits=[Edit("train.py", "0.5 * (1.0 + math.cos(math.pi * progress))", "(1.0 - progress)")], held_out=1),
    Case("eval_dropout_active", "fault", "evaluation with dropout active (model.eval() missing)",
         edits=[Edit("train.py", "    model.eval()\n", "")], held_out=1),
    Case("lr_times_shards", "fault", "learning rate multiplied by the 4 shards (a scaling rule applied twice)",
         edits=[Edit("train.py", 'p.add_argument("--lr", type=float, default=3e-3)',
                     'p.add_argument("--lr", type=float, default=1.2e-2)')], held_out=1),
]

XAVIER_INIT = init_edit("Glorot uniform (Keras's default)", "nn.init.xavier_uniform_(layer.weight)")
CASES += [
    Case("init_xavier_uniform", "benign", "another init distribution (Glorot uniform, zero bias)",
         edits=[XAVIER_INIT], held_out=2),
    Case("data_rng_stream", "benign", "the data order drawn from another RNG stream (seed + 10007)",
         edits=[Edit("train.py", "batches = train_batches(x_train, y_train, args.batch_size, seed=args.seed)",
                     "batches = train_batches(x_train, y_train, args.batch_size, seed=args.seed + 10007)")],
         held_out=2),
    Case("clip_norm_10x", "fault", "gradient clipping at norm 10 instead of 1 (another config's value)",
         edits=[Edit("train.py", "CLIP_NORM = 1.0", "CLIP_NORM = 10.0")], held_out=2),
    Case("adam_coupled_l2", "fault", "Adam with L2 in the gradient instead of AdamW's decoupled decay",
         edits=[Edit("train.py", "optimizer = torch.optim.AdamW(", "optimizer = torch.optim.Adam(")], held_out=2),
    Case("eval_half_test_set", "fault", "evaluation on the first half of the test set",
         edits=[Edit("train.py", "result = evaluate(model, x_test, y_test, device)",
                     "result = evaluate(model, x_test[:1024], y_test[:1024], device)")], held_out=2),
    Case("dropout_0_3", "fault", "dropout 0.3 instead of 0.1 (another config's default)",
         edits=[Edit("train.py", "dropout=0.1).to(device)", "dropout=0.3).to(device)")], held_out=2),
    Case("warmup_half", "fault", "warmup over half of the steps instead of 10%",
         edits=[Edit("train.py", "WARMUP_FRACTION = 0.1", "WARMUP_FRACTION = 0.5")], held_out=2),
]


class MutationError(RuntimeError):
    pass


def apply_edits(src: Path, dst: Path, edits: list[Edit]) -> list[str]:
    """Copy src to dst and apply the edits; return a one-line summary per edit. Raises MutationError."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(src, dst, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    done = []
    for e in edits:
        path = dst / e.file
        text = path.read_text()
        n = text.count(e.old)
        if n != e.count:
            raise MutationError(f"{e.file}: expected {e.count} occurrence(s) of {e.old!r}, found {n}: "
                                "the repo changed under the benchmark; update benchmarks/detection/cases.py")
        new_text = text.replace(e.old, e.new)
        if ast.dump(ast.parse(new_text)) == ast.dump(ast.parse(text)):
            raise MutationError(f"{e.file}: the edit {e.old!r} -> {e.new!r} does not change the code")
        path.write_text(new_text)
        done.append(f"{e.file}: {e.old.strip()[:60]!r} -> {e.new.strip()[:60]!r} (x{n})")
    return done
