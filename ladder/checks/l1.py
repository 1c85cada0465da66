"""L1: loss and metric near the baseline, and the loss trends agree.

The fixed rule (protocol [l1]) compares the run with one baseline run of the same kind. When the
baseline holds enough seeds (protocol [calibrated].min_seeds), the verdict comes from the seeds' own
spread instead (ladder.checks.stats), and the fixed rule's numbers are still reported beside it.
"""

from __future__ import annotations

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.compare import rel_diff, trend_test, window_mean
from ladder.runs.records import RunRecord
from ladder.checks.results import CheckResult


def _seed_runs(ctx: CheckContext) -> list[RunRecord]:
    if ctx.baseline is None:
        return []
    return ctx.baseline.full_runs if ctx.run.kind == "full" else ctx.baseline.short_runs


def _calibrated(ctx: CheckContext) -> bool:
    return len(_seed_runs(ctx)) >= ctx.protocol.calibrated.min_seeds


def _status(ok: bool | None) -> str:
    return "passed" if ok else "failed" if ok is not None else "undecided"


@register("L1", "loss_window")
def loss_window(ctx: CheckContext) -> CheckResult:
    ref = ctx.reference()
    if ref is None:
        return not_checked("L1", "loss_window", "no baseline run of this kind to compare with")
    frac = ctx.protocol.l1.window_fraction
    mine, theirs = window_mean(ctx.run.loss_curve, frac), window_mean(ref.loss_curve, frac)
    if mine is None or theirs is None:
        return CheckResult(level="L1", name="loss_window", status="failed",
                           evidence="no finite loss points in the run or the baseline")
    d = rel_diff(mine, theirs)
    tol = ctx.protocol.l1.loss_rel_tol
    fixed_ok = d <= tol
    details = {"fixed_rule": {"run": mine, "baseline": theirs, "rel_diff": d, "tol": tol, "passed": fixed_ok}}
    ev = (f"mean loss over the last {frac:.0%} of steps: run {mine:.5f} vs baseline {theirs:.5f} "
          f"(seed {ref.seed}), relative difference {d:.2%} (fixed rule: within {tol:.0%})")
    if _calibrated(ctx):
        from ladder.checks.stats import calibrated_loss_window

        v = calibrated_loss_window(ctx.run, _seed_runs(ctx), ctx.protocol)
        details["calibrated"] = v.as_dict()
        return CheckResult(level="L1", name="loss_window", status=_status(v.passed), measured=mine,
                           threshold=v.band, evidence=f"{v.explain()} | {ev}", details=details)
    return CheckResult(level="L1", name="loss_window", status=_status(fixed_ok), measured=round(d, 6),
                       threshold=tol, evidence=ev + " | one baseline seed: the fixed rule applies",
                       details=details)


@register("L1", "metric")
def metric(ctx: CheckContext) -> CheckResult:
    ref = ctx.reference()
    if ref is None or ref.metric is None:
        return not_checked("L1", "metric", "no baseline metric to compare with")
    if ctx.run.metric is None:
        return CheckResult(level="L1", name="metric", status="failed", evidence="the run reported no metric")
    d = rel_diff(ctx.run.metric, ref.metric)
    tol = ctx.protocol.l1.metric_rel_tol
    fixed_ok = d <= tol
    details = {"fixed_rule": {"run": ctx.run.metric, "baseline": ref.metric, "rel_diff": d, "tol": tol,
                              "passed": fixed_ok}}
    ev = (f"{ctx.run.metric_name}: run {ctx.run.metric:.5g} vs baseline {ref.metric:.5g} (seed {ref.seed}), "
          f"relative difference {d:.2%} (fixed rule: within {tol:.0%})")
    if _calibrated(ctx):
        from ladder.checks.stats import calibrated_metric

        v = calibrated_metric(ctx.run, _seed_runs(ctx), ctx.protocol)
        details["calibrated"] = v.as_dict()
        return CheckResult(level="L1", name="metric", status=_status(v.passed), measured=ctx.run.metric,
                           threshold=v.band, evidence=f"{v.explain()} | {ev}", details=details)
    return CheckResult(level="L1", name="metric", status=_status(fixed_ok), measured=round(d, 6), threshold=tol,
                       evidence=ev + " | one baseline seed: the fixed rule applies", details=details)


@register("L1", "trend")
def trend(ctx: CheckContext) -> CheckResult:
    ref = ctx.reference()
    if ref is None:
        return not_checked("L1", "trend", "no baseline run of this kind to compare with")
    p = ctx.protocol.l1
    t = trend_test(ctx.run.loss_curve, ref.loss_curve, p.trend_segments, p.trend_flat_tol, p.trend_near_flat)
    if t is None:
        return CheckResult(level="L1", name="trend", status="failed",
                           evidence="the run and the baseline share too few logged steps to compare trends")
    details = {"fixed_rule": {"agree": t.agree, "run_moves": t.run_moves, "base_moves": t.base_moves}}
    if _calibrated(ctx):
        from ladder.checks.stats import calibrated_curve

        v = calibrated_curve(ctx.run, _seed_runs(ctx), ctx.protocol)
        details["calibrated"] = v.as_dict()
        return CheckResult(level="L1", name="trend", status=_status(v.passed), measured=v.measured,
                           threshold=v.band, evidence=f"{v.explain()} | fixed-rule trend: {t.describe()}",
                           details=details)
    return CheckResult(level="L1", name="trend", status=_status(t.agree), measured=t.run_classes,
                       threshold=t.base_classes, evidence=t.describe(), details=details)
