"""The README's tables from the parity benchmark's results files (benchmarks/parity.py --out) and the corpus.

Usage (from the repository root):
    python3 benchmarks/ports-adapters/report.py benchmarks/ports-adapters/results-*.json [--runs WORK/runs]

Prints, as Markdown: the per-program tables (variant, kind, stack, held_out, parity verdict, first differing
tensor and its magnitude, curve verdict), recall on the faults one training batch can show (SCOPE below),
false alarms on faithful and benign ports with a 95% Wilson interval, the port side's wall time by stack,
and parity against the curve verdicts. --runs (the benchmark's --work/runs) adds each reference side's wall.
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CORPUS = ROOT / "benchmarks" / "ports"

# Why each fault is, or is not, one a parity check (the reference's weights and K fixed batches, K optimizer
# steps) can show. Read off each fault's `what` in corpus.toml, by mechanism, not by outcome.
STEP = "step"  # the model, the loss, the gradient or its reduction, clipping, the update rule: in scope
SCOPE = {
    # regress
    "fault_xla_loss_sum": STEP, "fault_jax_decoupled_wd": STEP, "fault_jax_nesterov": STEP,
    "fault_jax_broadcast_loss": STEP, "fault_jax_skip_bad_steps": STEP, "fault_jax_shard_map_grad_sum": STEP,
    "fault_xla_sched_per_epoch": "schedule after step K", "fault_jax_no_schedule": "schedule after step K",
    "fault_jax_flax_default_init": "initialisation", "fault_xla_eval_train": "evaluation",
    "fault_xla_model_on_cpu": "runtime", "fault_xla_median_monitor": "runtime", "fault_xla_item_per_step": "runtime",
    "fault_jax_static_lr": "runtime", "fault_jax_float_per_step": "runtime",
    # dpclass
    "dpclass/jax_pmap_psum": STEP, "torch_allreduce_twice": STEP, "jax_pmap_unsynced": STEP,
    "jax_shardmap_clip_per_replica": STEP, "xla_no_label_smoothing": STEP, "jax_adam_betas": STEP,
    "torch_eval_train_split": "evaluation", "torch_eval_rank0_shard": "evaluation",
    "xla_dropout_in_eval": "evaluation", "jax_host_read_every_step": "runtime", "xla_item_every_step": "runtime",
    # charlm
    "jax_multi_noembed": STEP, "jax_betas": STEP, "jax_mask_diag": STEP, "xla_no_clip": STEP,
    "jax_gelu_tanh": STEP, "charlm/jax_pmap_psum": STEP, "jax_flax_init": "initialisation",
    "xla_eval_half": "evaluation", "xla_grad_norm_item": "runtime", "jax_static_step": "runtime",
}


def scope(program: str, variant: str) -> str:
    return SCOPE.get(f"{program}/{variant}", SCOPE.get(variant, "?"))


def wilson(k: int, n: int, z: float = 1.96) -> tuple[float, float]:
    if n == 0:
        return (0.0, 1.0)
    p = k / n
    centre = (p + z * z / (2 * n)) / (1 + z * z / n)
    half = z * math.sqrt(p * (1 - p) / n + z * z / (4 * n * n)) / (1 + z * z / n)
    return (max(0.0, centre - half), min(1.0, centre + half))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("results", nargs="+", type=Path)
    ap.add_argument("--runs", type=Path)
    args = ap.parse_args()
    outcomes, commits = [], {}
    for path in args.results:
        data = json.loads(path.read_text())
        for o in data["outcomes"]:
            commits[o["program"]] = data["commit"][:7]
            outcomes.append(o)
    held = {}
    for toml_path in sorted(CORPUS.glob("*/corpus.toml")):
        for v in tomllib.loads(toml_path.read_text()).get("variant", []):
            held[(toml_path.parent.name, v["name"])] = v.get("held_out", False)

    for program in dict.fromkeys(o["program"] for o in outcomes):
        print(f"\n#### {program} (results file's commit {commits[program]})\n")
        print("| variant | kind | stack | held_out | parity | first tensor that differs | magnitude | port side (s) "
              "| curves |")
        print("|---|---|---|---|---|---|---|---|---|")
        for o in (o for o in outcomes if o["program"] == program):
            verdict = "skipped" if o["flagged"] is None else "**flagged**" if o["flagged"] else "passed"
            wall = "" if o["wall_s"] is None else f"{o['wall_s']:.1f}"
            kind = o["kind"] + (f" ({scope(program, o['variant'])})" if o["kind"] == "fault" else "")
            print(f"| {o['variant']} | {kind} | {o['stack']} | {'yes' if held[(program, o['variant'])] else 'no'} "
                  f"| {verdict} | {o['first'] or ''} | {(o['magnitude'] or '').replace('|', chr(92) + '|')} | {wall} | {o['curves'] or '-'} |")

    judged = [o for o in outcomes if o["flagged"] is not None]
    faults = [o for o in judged if o["kind"] == "fault"]
    print("\n#### Recall by fault class\n")
    print("| class | flagged / faults | flagged |")
    print("|---|---|---|")
    for cls in dict.fromkeys(scope(o["program"], o["variant"]) for o in faults):
        fs = [o for o in faults if scope(o["program"], o["variant"]) == cls]
        hit = [f"{o['program']}/{o['variant']}" for o in fs if o["flagged"]]
        print(f"| {cls} | {len(hit)}/{len(fs)} | {', '.join(hit)} |")
    step = [o for o in faults if scope(o["program"], o["variant"]) == STEP]
    k = sum(o["flagged"] for o in step)
    lo, hi = wilson(k, len(step))
    print(f"\nrecall on one-step faults: {k}/{len(step)} (95% Wilson {lo:.2f}-{hi:.2f}); "
          f"on all faults {sum(o['flagged'] for o in faults)}/{len(faults)}")
    ok = [o for o in judged if o["kind"] in ("faithful", "benign")]
    fa = sum(o["flagged"] for o in ok)
    lo, hi = wilson(fa, len(ok))
    print(f"false alarms on faithful and benign: {fa}/{len(ok)} (95% Wilson {lo:.3f}-{hi:.3f}): "
          f"{', '.join(o['program'] + '/' + o['variant'] for o in ok if o['flagged'])}")

    print("\n#### Port side wall time (s), by stack\n")
    print("| stack | sides | median | max |")
    print("|---|---|---|---|")
    for stack in ("torch", "xla", "jax"):
        w = [o["wall_s"] for o in judged if o["stack"] == stack and o["wall_s"] is not None]
        if w:
            print(f"| {stack} | {len(w)} | {statistics.median(w):.1f} | {max(w):.1f} |")
    w = [o["wall_s"] for o in judged if o["wall_s"] is not None]
    print(f"| all | {len(w)} | {statistics.median(w):.1f} | {max(w):.1f} |")
    if args.runs:
        for program in dict.fromkeys(o["program"] for o in outcomes):
            run = args.runs / program / "reference" / "run.json"
            if run.is_file():
                r = json.loads(run.read_text())
                print(f"\nreference side, {program}: {r['ended_at'] - r['started_at']:.1f} s", end="")
        print()

    print("\n#### Parity against the curves (faults with a curve verdict)\n")
    for label, test in (("parity flags, curves miss (0/n)", lambda o: o["flagged"] and o["curves"].startswith("0/")),
                        ("curves flag (k/n, k > 0), parity misses", lambda o: not o["flagged"] and o["curves"]
                         and not o["curves"].startswith("0/")),
                        ("both flag", lambda o: o["flagged"] and o["curves"] and not o["curves"].startswith("0/")),
                        ("neither", lambda o: not o["flagged"] and o["curves"].startswith("0/"))):
        xs = [f"{o['program']}/{o['variant']} ({o['curves']})" for o in faults if o["curves"] and test(o)]
        print(f"- {label}: {len(xs)}: {', '.join(xs)}")
    none = [f"{o['program']}/{o['variant']}" for o in faults if not o["curves"]]
    print(f"- no curve verdict: {len(none)}: {', '.join(none)}")
    ok_curves = [o for o in ok if o["curves"] and not o["curves"].startswith("0/")]
    print(f"- faithful/benign the curves flag: {', '.join(o['program'] + '/' + o['variant'] + ' (' + o['curves'] + ')' for o in ok_curves) or 'none'}")


if __name__ == "__main__":
    main()
