"""L4: L3 holds and the run is faster and cheaper than the baseline's full run.

Faster: the median time per training step: from the probe's step clock when it has one (the time
between optimizer steps), else from the loss lines' timestamps (interval / steps between the lines);
either way without the intervals that hold an evaluation, and without the first
[l4].skip_first_intervals intervals (compilation and warm-up). Wall time and compile time (from the
probe report, when it recorded any) are reported beside it, not folded in. Cheaper: hours of wall time x
price_per_hour x chips, as recorded in each RunRecord. "L3 holds" is the ladder's climb: when an L3 check
did not pass, run_ladder turns this check into not_checked (speed is not judged for a wrong result).
"""

from __future__ import annotations

import statistics
from typing import Any

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.l3 import full_run_of
from ladder.runs.records import RunRecord
from ladder.checks.results import CheckResult

NAME = "faster_cheaper"


def median_step_time(run: RunRecord, skip_first: int) -> float | None:
    """Median seconds per training step, evaluation excluded; None with no usable interval."""
    from ladder.runs.probe_report import eval_steps, main_process

    main = main_process(run.probe or {})
    times = ((main or {}).get("clock") or {}).get("step_times") or []
    if len(times) > skip_first + 2:
        evals = eval_steps(run, main)
        windows = [(float(w.get("t0") or 0), float(w.get("t1") or 0)) for w in (main or {}).get("eval_windows") or []]
        pts = [(int(s), float(t)) for s, t in times]
        per_step = [(t1 - t0) / (s1 - s0) for (s0, t0), (s1, t1) in zip(pts, pts[1:])
                    if s1 > s0 and not any(s0 <= e < s1 for e in evals)
                    and not any(a < t1 and b > t0 for a, b in windows)]
    else:
        evals = {e.step for e in run.evals if e.step is not None}
        pts2 = sorted(run.loss_curve, key=lambda p: p.step)
        per_step = [(b.t - a.t) / (b.step - a.step) for a, b in zip(pts2, pts2[1:])
                    if b.step > a.step and not any(a.step <= e < b.step for e in evals)]
    per_step = per_step[skip_first:]
    return statistics.median(per_step) if per_step else None


def compile_seconds(probe: dict[str, Any] | None) -> float | None:
    """Compilation time the probe measured (XLA CompileTime, JAX backend compiles); None if unknown."""
    if not probe:
        return None
    total, seen = 0.0, False
    for proc in probe.get("processes") or []:
        xla_compile = (proc.get("xla") or {}).get("compile") or {}
        if "total" in xla_compile:
            total += float(xla_compile["total"]) / 1e9  # torch_xla's CompileTime metric is in nanoseconds
            seen = True
        for c in (proc.get("jax") or {}).get("compiles") or []:
            if "duration_s" in c:
                total += float(c["duration_s"])
                seen = True
    return total if seen else None


def cost(run: RunRecord) -> float | None:
    if run.wall_s is None:
        return None
    return run.wall_s / 3600.0 * run.price_per_hour * run.chips


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or b is None or b == 0 else a / b


def _fmt(x: float | None, unit: str = "") -> str:
    return "?" if x is None else f"{x:.4g}{unit}"


@register("L4", NAME)
def faster_cheaper(ctx: CheckContext) -> CheckResult:
    run = full_run_of(ctx)
    if run is None:
        return not_checked("L4", NAME, "no full run of this attempt: L4 compares full runs")
    ref = ctx.reference_full()
    if ref is None:
        return not_checked("L4", NAME, "the baseline has no full run to compare speed and cost with")
    rules = ctx.protocol.l4
    mine, theirs = median_step_time(run, rules.skip_first_intervals), median_step_time(ref, rules.skip_first_intervals)
    c_run, c_ref = cost(run), cost(ref)
    speedup = _ratio(theirs, mine)
    cost_ratio = _ratio(c_run, c_ref)
    wall_ratio = _ratio(run.wall_s, ref.wall_s)
    table = {
        "median_step_s": {"run": mine, "baseline": theirs, "speedup": speedup},
        "wall_s": {"run": run.wall_s, "baseline": ref.wall_s, "ratio": wall_ratio},
        "compile_s": {"run": compile_seconds(run.probe), "baseline": compile_seconds(ref.probe)},
        "cost": {"run": c_run, "baseline": c_ref, "ratio": cost_ratio,
                 "run_price_per_hour": run.price_per_hour, "run_chips": run.chips,
                 "baseline_price_per_hour": ref.price_per_hour, "baseline_chips": ref.chips},
    }
    ev = (f"median step {_fmt(mine, 's')} vs {_fmt(theirs, 's')} (speedup {_fmt(speedup, 'x')}); wall "
          f"{_fmt(run.wall_s, 's')} vs {_fmt(ref.wall_s, 's')} (ratio {_fmt(wall_ratio)}); compile "
          f"{_fmt(table['compile_s']['run'], 's')} vs {_fmt(table['compile_s']['baseline'], 's')}; cost "
          f"{_fmt(c_run)} vs {_fmt(c_ref)} (ratio {_fmt(cost_ratio)}; hours x price/h x chips)")
    missing = []
    if rules.require_faster and speedup is None:
        missing.append("step times (fewer than two loss lines after warm-up in one of the runs)")
    if rules.require_cheaper and (cost_ratio is None or c_ref == 0):
        missing.append("costs (a run without an end time or a price_per_hour of 0: set it in the profile)")
    if missing:
        return CheckResult(level="L4", name=NAME, status="not_checked", measured=table,
                           evidence=f"cannot judge {' and '.join(missing)} | {ev}", details=table)
    faster = speedup is not None and speedup > rules.min_speedup
    cheaper = cost_ratio is not None and cost_ratio < rules.max_cost_ratio
    ok = (faster or not rules.require_faster) and (cheaper or not rules.require_cheaper)
    return CheckResult(level="L4", name=NAME, status="passed" if ok else "failed", measured=table,
                       threshold={"min_speedup": rules.min_speedup, "max_cost_ratio": rules.max_cost_ratio},
                       evidence=f"faster: {faster}, cheaper: {cheaper} | {ev}", details=table)
