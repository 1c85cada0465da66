"""L0: the run finishes, with a loss curve and a headline metric, and no NaN/Inf in the loss."""

from __future__ import annotations

import math

from ladder.checks import CheckContext, register
from ladder.checks.results import CheckResult


def _result(name: str, ok: bool, measured, threshold, evidence: str) -> CheckResult:
    return CheckResult(level="L0", name=name, status="passed" if ok else "failed",
                       measured=measured, threshold=threshold, evidence=evidence)


@register("L0", "finished")
def finished(ctx: CheckContext) -> CheckResult:
    r = ctx.run
    if r.infrastructure is not None:  # the code was not given its chance: neither passed nor the port's failure
        return CheckResult(level="L0", name="finished", status="not_checked", measured=r.infrastructure.kind,
                           threshold="exit 0", evidence=f"infrastructure failure ({r.infrastructure.kind}), not the "
                           f"code's: {r.infrastructure.detail}")
    if r.ended_at is None:
        return _result("finished", False, None, "exit 0", "the run never finished (ladder was stopped mid-run)")
    if r.timed_out:
        return _result("finished", False, f"timeout after {r.timeout_s:.0f}s", "exit 0 before the timeout",
                       f"killed after {r.timeout_s:.0f}s; last lines: {r.last_lines[-3:]}")
    ok = r.exit_code == 0
    ev = f"exit code {r.exit_code}"
    if not ok:
        ev += "; " + ("error lines: " + " | ".join(r.error_lines[:5]) if r.error_lines
                      else f"last lines: {r.last_lines[-5:]}")
    return _result("finished", ok, r.exit_code, 0, ev)


@register("L0", "loss_logged")
def loss_logged(ctx: CheckContext) -> CheckResult:
    r = ctx.run
    n = r.loss_lines
    ev = f"{n} loss lines parsed"
    if n == 0:
        ev += f"; the loss pattern matched nothing. First lines of output: {r.first_lines[:8]}"
    return _result("loss_logged", n > 0, n, "> 0", ev)


@register("L0", "metric_reported")
def metric_reported(ctx: CheckContext) -> CheckResult:
    r = ctx.run
    ok = r.metric is not None and math.isfinite(r.metric)
    ev = f"{r.metric_name} = {r.metric}" if ok else (
        f"the headline metric {r.metric_name!r} is {r.metric}: not a finite number" if r.metric is not None else
        f"no headline metric {r.metric_name!r} found; last lines of output: {r.last_lines[-8:]}")
    return _result("metric_reported", ok, r.metric, "a number", ev)


@register("L0", "finite_loss")
def finite_loss(ctx: CheckContext) -> CheckResult:
    bad = ctx.run.nonfinite_losses
    ev = "no NaN/Inf in the logged loss" if not bad else (
        f"first non-finite loss at step {bad[0].step} ({bad[0].loss}); {len(bad)} such lines recorded")
    return _result("finite_loss", not bad, len(bad), 0, ev)


@register("L0", "integrity")
def integrity(ctx: CheckContext) -> CheckResult:
    """The spec, the protocols, the baselines and the journal were unchanged while the run ran."""
    bad = ctx.run.integrity
    ev = ("nothing ladder protects changed while the run ran (spec, protocols, baselines, journal head)" if not bad
          else "the run changed what decides its own verdict: " + "; ".join(bad[:6]))
    return _result("integrity", not bad, len(bad), 0, ev)
