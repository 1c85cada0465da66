"""L3: the main result (the full run's headline metric) is preserved against the baseline's full run(s).

Which rule decides, in order: a hidden target (protocol [l3].hidden_target, XStack mode: value and
tolerance in a file beside the baseline, never in the code under test's copy); else, under the
protocol's calibrated rule, the band of the baseline's full runs (with fewer than min_seeds of them, the
short seeds' relative spread around the full runs' mean, said so; with neither, undecided); else (the
protocol's fixed rule) the fixed rule against the full run. The other rules are reported beside it.
Without a full run there is nothing to judge: not_checked.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.compare import rel_diff
from ladder.runs.records import RunRecord
from ladder.checks.results import CheckResult

NAME = "main_result"


def full_run_of(ctx: CheckContext) -> RunRecord | None:
    if ctx.full_run is not None:
        return ctx.full_run
    return ctx.run if ctx.run.kind == "full" else None


def hidden_target_path(ctx: CheckContext) -> Path | None:
    """Where the hidden target lives: ctx.options['hidden_target'], else the protocol's path
    relative to the baseline directory; None when neither names one."""
    raw = ctx.options.get("hidden_target") or ctx.protocol.l3.hidden_target
    if not raw:
        return None
    p = Path(raw)
    if p.is_absolute() or ctx.baseline is None:
        return p
    return ctx.baseline.root / p


def read_hidden_target(path: Path) -> dict[str, Any]:
    """{value, tolerance, direction?}: the direction defaults to the run's metric direction."""
    data = tomllib.loads(path.read_text())
    missing = [k for k in ("value", "tolerance") if not isinstance(data.get(k), (int, float))]
    if missing:
        raise ValueError(f"{path} lacks numeric {', '.join(missing)}")
    if data.get("direction", "max") not in ("max", "min"):
        raise ValueError(f"{path}: direction must be 'max' or 'min'")
    return data


def meets_target(value: float, target: float, tolerance: float, direction: str) -> bool:
    # XStack's rule is one-sided: the target minus (or plus, for a loss) the tolerance is the bar.
    return value >= target - tolerance if direction == "max" else value <= target + tolerance


def _signed_change(value: float, ref: float, direction: str) -> str:
    if ref == 0:
        return "n/a"
    change = (value - ref) / abs(ref)
    better = (change > 0) == (direction == "max")
    return f"{change:+.2%} ({'better' if better else 'worse' if change else 'equal'})"


@register("L3", NAME)
def main_result(ctx: CheckContext) -> CheckResult:
    run = full_run_of(ctx)
    if run is None:
        return not_checked("L3", NAME, "no full run of this attempt: L3 needs one (`ladder run --kind full`)")
    if run.metric is None or not math.isfinite(run.metric):
        return CheckResult(level="L3", name=NAME, status="failed",
                           evidence=f"the full run reported no finite {run.metric_name or 'metric'}")
    direction = run.metric_direction
    fulls = [] if ctx.baseline is None else ctx.baseline.full_runs
    details: dict[str, Any] = {}
    lines: list[str] = []
    ref = ctx.reference_full()
    if ref is not None and ref.metric is not None:
        tol = ctx.protocol.l3.metric_rel_tol
        d = rel_diff(run.metric, ref.metric)
        details["fixed_rule"] = {"run": run.metric, "baseline": ref.metric, "rel_diff": d, "tol": tol,
                                 "passed": d <= tol}
        lines.append(f"fixed rule: {run.metric:.5g} vs baseline full run {ref.metric:.5g} (seed {ref.seed}), "
                     f"{_signed_change(run.metric, ref.metric, direction)}, within {tol:.0%}: {d <= tol}")
    verdict = None
    if ctx.protocol.l1.rule == "calibrated" and fulls:
        from ladder.checks.stats import Seeds, calibrated_metric

        shorts = [] if ctx.baseline is None else list(ctx.baseline.short_runs)
        verdict = calibrated_metric(run, Seeds(list(fulls), shorts, "short"), ctx.protocol)
        details["calibrated"] = verdict.as_dict()
        lines.insert(0, verdict.explain())

    target_path = hidden_target_path(ctx)
    if target_path is not None:
        if not target_path.exists():
            return not_checked("L3", NAME, f"the protocol names a hidden target {target_path}, which does not "
                                           "exist; write it (value, tolerance) beside the baseline")
        try:
            tgt = read_hidden_target(target_path)
        except (ValueError, tomllib.TOMLDecodeError) as e:
            return CheckResult(level="L3", name=NAME, status="failed", evidence=f"unreadable hidden target: {e}")
        tdir = tgt.get("direction", direction)
        ok = meets_target(run.metric, float(tgt["value"]), float(tgt["tolerance"]), tdir)
        bar = tgt["value"] - tgt["tolerance"] if tdir == "max" else tgt["value"] + tgt["tolerance"]
        details["hidden_target"] = {"value": tgt["value"], "tolerance": tgt["tolerance"], "direction": tdir,
                                    "bar": bar, "passed": ok}
        ev = (f"hidden target: {run.metric_name} {run.metric:.5g} {'>=' if tdir == 'max' else '<='} bar "
              f"{bar:.5g} (target {tgt['value']:g}, tolerance {tgt['tolerance']:g}): {ok}")
        return CheckResult(level="L3", name=NAME, status="passed" if ok else "failed", measured=run.metric,
                           threshold={"bar": bar, "direction": tdir}, evidence=" | ".join([ev] + lines),
                           details=details)
    if verdict is not None:
        return CheckResult(level="L3", name=NAME, status=verdict.status, measured=run.metric,  # type: ignore[arg-type]
                           threshold=verdict.band, evidence=" | ".join(lines), details=details)
    if "fixed_rule" in details:
        ok = details["fixed_rule"]["passed"]
        return CheckResult(level="L3", name=NAME, status="passed" if ok else "failed",
                           measured=round(details["fixed_rule"]["rel_diff"], 6),
                           threshold=ctx.protocol.l3.metric_rel_tol,
                           evidence=" | ".join(lines) + " | the protocol's rule is the fixed rule",
                           details=details)
    return not_checked("L3", NAME, "the baseline has no full run with a metric to compare with")
