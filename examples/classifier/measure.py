"""Run the original repo and both ports over several seeds and tabulate the results.

Usage (from the repository root, main python):
    python3 examples/classifier/measure.py --seeds 0 1 2 3 4 --steps 300 [--json OUT.json]

Each program runs as a fresh subprocess with OMP_NUM_THREADS=1 and
PJRT_DEVICE=CPU; wall time is the subprocess's, start-up and imports included.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import statistics
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
PROGRAMS = {
    "torch (repo)": (sys.executable, HERE / "repo"),
    "torch_xla": ("/tmp/envs/xla/bin/python", HERE / "ports" / "xla"),
    "jax": ("/tmp/envs/jax/bin/python", HERE / "ports" / "jax"),
}
STEP_RE = re.compile(r"^step (\d+) loss (\S+) lr (\S+)$", re.M)
METRIC_RE = re.compile(r"^metric (\w+)=(\S+)$", re.M)


def run_once(python: str, workdir: Path, seed: int, steps: int) -> dict[str, float]:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PJRT_DEVICE": "CPU"}
    start = time.perf_counter()
    proc = subprocess.run(
        [python, "train.py", "--seed", str(seed), "--steps", str(steps)],
        cwd=workdir, env=env, capture_output=True, text=True, check=True,
    )
    wall = time.perf_counter() - start
    losses = [(int(s), float(l)) for s, l, _ in STEP_RE.findall(proc.stdout)]
    metrics = {k: float(v) for k, v in METRIC_RE.findall(proc.stdout)}
    tail = [l for s, l in losses if s > 0.75 * steps]
    return {**metrics, "train_loss_last25": statistics.fmean(tail), "wall_s": wall}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--json", type=Path)
    args = p.parse_args()

    results: dict[str, list[dict[str, float]]] = {}
    print("| program | seed | test_acc | test_loss | train loss (last 25%) | wall s |")
    print("|---|---|---|---|---|---|")
    for name, (python, workdir) in PROGRAMS.items():
        results[name] = []
        for seed in args.seeds:
            r = run_once(python, workdir, seed, args.steps)
            results[name].append(r)
            print(f"| {name} | {seed} | {r['test_acc']:.4f} | {r['test_loss']:.4f} "
                  f"| {r['train_loss_last25']:.4f} | {r['wall_s']:.1f} |", flush=True)

    print("\n| program | test_acc mean ± sd | test_loss mean ± sd | train loss (last 25%) mean ± sd | wall s mean |")
    print("|---|---|---|---|---|")
    for name, rows in results.items():
        cells = []
        for key in ("test_acc", "test_loss", "train_loss_last25"):
            vals = [r[key] for r in rows]
            cells.append(f"{statistics.fmean(vals):.4f} ± {statistics.stdev(vals):.4f}")
        wall = statistics.fmean(r["wall_s"] for r in rows)
        print(f"| {name} | {' | '.join(cells)} | {wall:.1f} |")
    if args.json:
        args.json.write_text(json.dumps({"steps": args.steps, "seeds": args.seeds, "results": results}, indent=1))


if __name__ == "__main__":
    main()
