"""Fault-injection benchmark: does ladder's calibrated verdict flag silent faults and pass benign ports,
and does it beat the fixed rule (5% loss window, 1% metric, trend) on the same runs?

Usage (from the repository root, main python; about 15 minutes on 2 cores):
    python3 benchmarks/detection/bench.py [--work /tmp/ladder-detection] [--trials 4] [--reuse]

Everything goes through ladder itself: `execute_run` captures every run, `create_baseline` stores the
baseline (its short and full runs are executed two at a time first and then adopted by
create_baseline's resume path), and `run_ladder` judges each trial. A trial is one case at one seed
the baseline never saw: a short run (L1) and a full run (L3). "Flagged" means an L1 or L3 check did
not pass (failed, or undecided after every extra seed the verdict asked for was added).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import shutil
import statistics
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(HERE))

from cases import CASES, apply_edits  # noqa: E402
from ladder.baselines.store import Baseline, create_baseline  # noqa: E402
from ladder.checks import CheckContext, run_ladder  # noqa: E402
from ladder.checks.compare import curve_arrays, window_mean  # noqa: E402
from ladder.runs.records import RunRecord  # noqa: E402
from ladder.runs.execute import execute_run  # noqa: E402
from ladder.migration.spec import load_spec, load_spec_protocol  # noqa: E402
from ladder.checks.stats import grad_norm_series  # noqa: E402

EXAMPLE = ROOT / "examples" / "classifier"
XLA_PYTHON = "/tmp/envs/xla/bin/python"
JAX_PYTHON = "/tmp/envs/jax/bin/python"
MEASURABLE_SD = 2.0  # a mean shift over the trials of 2 seed sds is 4 standard errors with 4 trials
# the calibrated (or fixed-rule) checks: the short run's L1, the full run's L1 and L3
JUDGED = [f"{kind}:L1/{n}" for kind in ("short", "full") for n in ("loss_window", "metric", "trend")] + ["full:L3/main_result"]

SPEC = '''name = "classifier"
source = "src/repo"
protocol = "ncsu"

[experiment]
short = "{{python}} train.py --seed {{seed}} --steps {{steps}}"
full = "{{python}} train.py --seed {{seed}} --steps {{steps}}"
short_steps = {short_steps}
full_steps = {full_steps}
expected_minutes_short = 1
expected_minutes_full = 2

[parse]
loss = '^step (?P<step>\\d+) loss (?P<loss>\\S+)'
metric = '^metric test_acc=(?P<value>\\S+)'
metric_name = "test_acc"
direction = "max"
eval = '^eval step (?P<step>\\d+) items (?P<items>\\d+) loss (?P<loss>\\S+) acc (?P<acc>\\S+)'

[profiles.reference]
platform = "cpu"
python = "{torch_python}"
price_per_hour = 1.0
env = {{ OMP_NUM_THREADS = "1" }}

[profiles.target]
platform = "cpu"
python = "{torch_python}"
price_per_hour = 1.0
env = {{ OMP_NUM_THREADS = "1" }}

[profiles.xla]
platform = "xla"
python = "{xla_python}"
price_per_hour = 1.0
env = {{ OMP_NUM_THREADS = "1", PJRT_DEVICE = "CPU" }}

[profiles.jax]
platform = "jax-cpu"
python = "{jax_python}"
price_per_hour = 1.0
env = {{ OMP_NUM_THREADS = "1", JAX_PLATFORMS = "cpu", XLA_FLAGS = "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1" }}
'''


def log(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def prepare(work: Path, args: argparse.Namespace) -> dict[str, Path]:
    """The workspace: spec, the reference copy, every mutant (edits verified), the ports."""
    src = work / "src"
    src.mkdir(parents=True, exist_ok=True)
    apply_edits(EXAMPLE / "repo", src / "repo", [])
    sources = {}
    for case in CASES:
        if case.port:
            sources[case.name] = EXAMPLE / "ports" / case.port
        elif case.edits:
            summary = apply_edits(EXAMPLE / "repo", src / case.name, case.edits)
            log(f"mutant {case.name}: " + "; ".join(summary))
            sources[case.name] = src / case.name
        else:
            sources[case.name] = src / "repo"
    (work / "ladder.toml").write_text(SPEC.format(short_steps=args.short_steps, full_steps=args.full_steps,
                                                  torch_python=sys.executable, xla_python=XLA_PYTHON,
                                                  jax_python=JAX_PYTHON))
    return sources


def _ok(run_dir: Path) -> RunRecord | None:
    try:
        r = RunRecord.load(run_dir)
    except Exception:
        return None
    return r if r.exit_code == 0 and r.metric is not None else None


def capture(spec, profile: str, kind: str, seed: int, source: Path, run_dir: Path, reuse: bool) -> RunRecord:
    if reuse and (prior := _ok(run_dir)) is not None:
        return prior
    if run_dir.exists():
        shutil.rmtree(run_dir)
    rec = execute_run(spec, profile, kind, seed, source=source, run_dir=run_dir)
    shutil.rmtree(run_dir / "work", ignore_errors=True)
    if rec.exit_code != 0 or rec.metric is None:
        raise RuntimeError(f"{run_dir}: exit {rec.exit_code}, metric {rec.metric}; last lines {rec.last_lines[-5:]}")
    return rec


def build_baseline(spec, work: Path, args: argparse.Namespace, pool: ThreadPoolExecutor) -> Baseline:
    final = spec.baselines_dir / "v1"
    if args.reuse and final.exists():
        return Baseline.load(final)
    shutil.rmtree(spec.baselines_dir, ignore_errors=True)
    partial = spec.baselines_dir / ".v1.partial"
    plan = [("short", s) for s in range(args.short_seeds)] + [("full", s) for s in range(args.full_seeds)]
    futs = [pool.submit(capture, spec, "reference", k, s, spec.source_dir, partial / f"{k}-s{s}", False)
            for k, s in plan]
    for f in futs:
        f.result()
    return create_baseline(spec, seeds=args.short_seeds, full_seeds=args.full_seeds)


def judge(protocol, base: Baseline, short: RunRecord, full: RunRecord, k_short: int, k_full: int) -> dict:
    """Both runs of a trial judged as the supervisor judges them: the short run up to L2, the full run up
    to L3 (its own L1 checks against the baseline's full runs, then L3)."""
    view = dataclasses.replace(base, short_runs=base.short_runs[:k_short], full_runs=base.full_runs[:k_full])
    out = {}
    for kind, run, up_to in (("short", short, "L2"), ("full", full, "L3")):
        res = run_ladder(CheckContext(run=run, protocol=protocol, baseline=view, expected_platform=run.platform,
                                      full_run=run if kind == "full" else None), up_to=up_to)
        out.update({f"{kind}:{c.level}/{c.name}": c for c in res.checks if c.level != "L0"})
    return out


def _more(checks: dict, prefix: str) -> int:
    return max([c.details["calibrated"]["more_seeds"] for key, c in checks.items()
                if key in JUDGED and key.startswith(prefix) and c.status == "undecided"] or [0])


def verdicts(protocol, base: Baseline, short: RunRecord, full: RunRecord, k0: int) -> dict:
    """The calibrated verdict at k0 seeds, then with the extra seeds it asked for; and the fixed rule."""
    ks, kf = min(k0, len(base.short_runs)), min(k0, len(base.full_runs))
    first = judge(protocol, base, short, full, ks, kf)
    checks, rounds = first, 0
    while rounds < 3 and any(checks[k].status == "undecided" for k in JUDGED):
        ns = min(ks + _more(checks, "short:"), len(base.short_runs))
        nf = min(kf + _more(checks, "full:"), len(base.full_runs))
        if (ns, nf) == (ks, kf):
            break  # the seeds asked for are not in the baseline: stays undecided (flagged)
        ks, kf, rounds = ns, nf, rounds + 1
        checks = judge(protocol, base, short, full, ks, kf)
    fixed = judge(protocol, base, short, full, 1, 1)
    status = lambda cs: {k: cs[k].status for k in JUDGED}  # noqa: E731
    l2 = lambda cs: {k: c.status for k, c in cs.items() if "/" in k and k.split(":")[1].startswith("L2")}  # noqa: E731
    return {"initial": status(first), "final": status(checks), "seeds_used": [ks, kf], "fixed": status(fixed),
            "ladder": {**status(checks), **l2(checks)}, "fixed_ladder": {**status(fixed), **l2(fixed)},
            "l2_detail": {k: c.evidence[:300] for k, c in checks.items() if k in l2(checks) and c.status != "passed"},
            "fixed_detail": {k: fixed[k].evidence[:300] for k in JUDGED},
            "final_detail": {k: checks[k].evidence[:600] for k in JUDGED}}


def flagged(statuses: dict, short_only: bool = False) -> bool:
    return any(s != "passed" for key, s in statuses.items() if not short_only or key.startswith("short:"))


def _mean_sd(xs: list[float]) -> tuple[float, float]:
    return statistics.fmean(xs), statistics.stdev(xs)


def effects(base: Baseline, protocol, trials: list[dict]) -> dict:
    """A case's measured effect: mean shift of each quantity, in baseline seed sds and in percent."""
    frac = protocol.l1.window_fraction
    ref = {"metric_short": [r.metric for r in base.short_runs],
           "loss_short": [window_mean(r.loss_curve, frac) for r in base.short_runs],
           "loss_full": [window_mean(r.loss_curve, frac) for r in base.full_runs],
           "metric_full": [r.metric for r in base.full_runs]}
    out = {}
    for key, vals in ref.items():
        m, sd = _mean_sd(vals)
        xs = [t[key] for t in trials]
        shift = statistics.fmean(xs) - m
        out[key] = {"mean": statistics.fmean(xs), "shift_sd": shift / sd if sd else math.inf,
                    "shift_rel": shift / abs(m)}
    return out


def block_shift(protocol, seeds: list[RunRecord], runs: list[RunRecord], series, skip: float = 0.0) -> dict:
    """The largest mean shift of a curve block (the calibrated curve check's blocks), in seed sds and in %.
    `series(run)` gives (steps, values); blocks are cut on the first seed's steps after the first `skip`
    of them, as the check cuts them."""
    import numpy as np

    from ladder.checks.stats import smooth

    xy = [series(r) for r in seeds]
    mine_xy = [series(r) for r in runs]
    if any(x is None for x in xy + mine_xy):
        return {"shift_sd": float("nan"), "shift_rel": float("nan")}
    grid = xy[0][0]
    grid = grid[grid >= grid[0] + skip * (grid[-1] - grid[0])]
    blocks = np.array_split(np.arange(len(grid)), protocol.calibrated.curve_segments)
    frac = protocol.calibrated.smoothing_fraction
    per = lambda pts: [[c[b].mean() for b in blocks] for c in (smooth(np.interp(grid, x, y), frac) for x, y in pts)]  # noqa: E731
    seeds_b, mine_b = np.array(per(xy)), np.array(per(mine_xy))
    m = seeds_b.mean(axis=0)
    z = (mine_b.mean(axis=0) - m) / seeds_b.std(axis=0, ddof=1)
    i = int(np.argmax(np.abs(z)))
    return {"shift_sd": float(z[i]), "shift_rel": float((mine_b.mean(axis=0)[i] - m[i]) / abs(m[i]))}


def rate(rows: list[dict], kind_fault: bool, key: str, short_only: bool = False,
         measurable: bool = False) -> tuple[int, int]:
    sel = [t for r in rows if (r["kind"] == "fault") == kind_fault and (not measurable or r["effect"]["measurable"])
           for t in r["trials"]]
    return sum(flagged(t[key], short_only) for t in sel), len(sel)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--work", type=Path, default=Path("/tmp/ladder-detection"))
    p.add_argument("--trials", type=int, default=4, help="seeds per case (100, 101, ...)")
    p.add_argument("--short-seeds", type=int, default=10, help="baseline short runs stored")
    p.add_argument("--full-seeds", type=int, default=10, help="baseline full runs stored")
    p.add_argument("--seeds", type=int, default=5, help="baseline seeds the verdict starts with")
    p.add_argument("--short-steps", type=int, default=300)
    p.add_argument("--full-steps", type=int, default=1000)
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--reuse", action="store_true", help="reuse finished runs in --work (re-score only)")
    p.add_argument("--cases", nargs="*", help="only these cases")
    args = p.parse_args()
    t0 = time.time()
    work = args.work.resolve()
    if not args.reuse and work.exists():
        shutil.rmtree(work)
    sources = prepare(work, args)
    spec = load_spec(work / "ladder.toml")
    protocol = load_spec_protocol(spec)
    cases = [c for c in CASES if not args.cases or c.name in args.cases]
    with ThreadPoolExecutor(args.jobs) as pool:
        log(f"baseline: {args.short_seeds} short + {args.full_seeds} full reference runs")
        base = build_baseline(spec, work, args, pool)
        log(f"baseline stored at {base.root} ({time.time() - t0:.0f}s)")
        futs = {}
        for case in cases:
            for i in range(args.trials):
                seed = 100 + i
                for kind in ("short", "full"):
                    rd = work / "runs" / case.name / f"{kind}-s{seed}"
                    futs[(case.name, seed, kind)] = pool.submit(capture, spec, case.profile, kind, seed,
                                                                sources[case.name], rd, args.reuse)
        records = {}
        for key, f in futs.items():
            records[key] = f.result()
            log(f"done {key} metric {records[key].metric}")
    rows = []
    for case in cases:
        trials = []
        for i in range(args.trials):
            seed = 100 + i
            short, full = records[(case.name, seed, "short")], records[(case.name, seed, "full")]
            v = verdicts(protocol, base, short, full, args.seeds)
            v.update(seed=seed, metric_short=short.metric, metric_full=full.metric,
                     loss_short=window_mean(short.loss_curve, protocol.l1.window_fraction),
                     loss_full=window_mean(full.loss_curve, protocol.l1.window_fraction))
            trials.append(v)
        eff = effects(base, protocol, trials)
        shorts = [records[(case.name, 100 + i, "short")] for i in range(args.trials)]
        eff["curve_block"] = block_shift(protocol, base.short_runs, shorts, lambda r: curve_arrays(r.loss_curve))
        eff["grad_norm_block"] = block_shift(protocol, base.short_runs, shorts, lambda r: grad_norm_series(r, True),
                                             skip=protocol.calibrated.grad_norm_skip_fraction)
        eff["measurable"] = any(abs(v["shift_sd"]) >= MEASURABLE_SD for k, v in eff.items() if isinstance(v, dict))
        rows.append({"case": case.name, "kind": case.kind, "what": case.what, "trials": trials, "effect": eff,
                     "held_out": case.held_out})
    elapsed = time.time() - t0
    (work / "results.json").write_text(json.dumps(rows, indent=1, default=str))
    print(report(rows, args, elapsed))


def _fmt(e: dict) -> str:
    if not math.isfinite(e["shift_sd"]):
        return "n/a"
    return f"{e['shift_sd']:+.1f} sd, {e['shift_rel']:+.1%}"


def report(rows: list[dict], args: argparse.Namespace, elapsed: float) -> str:
    n = args.trials
    out = [f"Detection benchmark: {len(rows)} cases x {n} seeds; baseline {args.short_seeds} short "
           f"({args.short_steps} steps) + {args.full_seeds} full ({args.full_steps} steps) runs; the calibrated "
           f"verdict starts from {args.seeds} seeds and adds the seeds it asks for; wall {elapsed / 60:.1f} min.",
           "",
           "Effects: mean shift over the case's trials from the mean of all baseline seeds, in baseline seed sds "
           "(and %); 'curve' and 'grad norm' = the block of the short run's smoothed loss / scale-free gradient-norm "
           f"curve (the judged steps) with the largest shift. Flag counts are trials out of {n}; a trial is flagged when a check on its "
           "short run (L1) or full run (L1, L3) does not pass; '+ L2' adds L2's probe checks on both runs.",
           "",
           "| case | kind | test_acc short | loss window short | curve block | grad-norm block | loss window full "
           f"| test_acc full | calibrated @{args.seeds} seeds (undecided) | calibrated final | fixed rule "
           "| short run alone | ladder (calibrated + L2) | fixed rule + L2 |",
           "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        e = r["effect"]
        cells = [_fmt(e[k]) for k in ("metric_short", "loss_short", "curve_block", "grad_norm_block", "loss_full",
                                      "metric_full")]
        t = r["trials"]
        init_flag = sum(flagged(x["initial"]) for x in t)
        init_und = sum(any(s == "undecided" for s in x["initial"].values()) for x in t)
        counts = [sum(flagged(x[key], short_only=so) for x in t)
                  for key, so in (("final", False), ("fixed", False), ("final", True), ("ladder", False),
                                  ("fixed_ladder", False))]
        mark = "" if r["kind"] != "fault" or e["measurable"] else " (no measurable effect)"
        mark += f", held out {r['held_out']}" if r.get("held_out") else ""
        out.append(f"| {r['case']} | {r['kind']}{mark} | {' | '.join(cells)} | {init_flag}/{n} ({init_und}) | "
                   + " | ".join(f"{c}/{n}" for c in counts) + " |")
    out.append("")
    for label, key in (("ladder: calibrated L1/L3 plus L2's probe checks", "ladder"),
                       ("fixed rule plus the same L2 probe checks", "fixed_ladder"),
                       ("calibrated L1/L3, final (extra seeds added)", "final"),
                       (f"calibrated L1/L3 at {args.seeds} seeds (undecided counts as flagged)", "initial"),
                       ("fixed rule L1/L3 (one baseline seed)", "fixed")):
        hit, nf = rate(rows, True, key)
        fa, nb = rate(rows, False, key)
        mh, mn = rate(rows, True, key, measurable=True)
        out.append(f"- {label}: recall {hit}/{nf} = {hit / nf:.3f} (faults with a measurable effect: "
                   f"{mh}/{mn} = {mh / max(mn, 1):.3f}), false alarm {fa}/{nb} = {fa / nb:.3f}")
    for which, what in ((0, "the suite the protocol was set on"), (1, "held-out set 1 (spent)"),
                        (2, "held-out set 2 (first run)")):
        part = [r for r in rows if r.get("held_out", 0) == which]
        if not part:
            continue
        for label, key in (("ladder", "ladder"), ("fixed rule + L2", "fixed_ladder")):
            hit, nf = rate(part, True, key)
            fa, nb = rate(part, False, key)
            out.append(f"- {what}, {label}: recall {hit}/{nf} = {hit / max(nf, 1):.3f}, "
                       f"false alarm {fa}/{nb} = {fa / max(nb, 1):.3f}")
    hit, nf = rate(rows, True, "final", short_only=True)
    fa, nb = rate(rows, False, "final", short_only=True)
    out.append(f"- faults caught from the short run alone (calibrated L1): {hit}/{nf} = {hit / nf:.3f} "
               f"(false alarm {fa}/{nb} = {fa / nb:.3f})")
    return "\n".join(out)


if __name__ == "__main__":
    main()
