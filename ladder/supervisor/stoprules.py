"""Stop rules: when to stop attempting and ask the human (shared/protocol.md, section 1, step 6).

Pure functions of the journal so far and the latest run (or its ladder result): no clock is read, no
file is touched; "now" is the latest time the inputs record unless the caller passes one. Every limit
comes from the protocol ([limits], [l1]/[calibrated] through the L1 checks, [l4] for step times). A
supervisor builds a JournalSoFar from its journal and calls `stop_decisions`; each rule says why.

Boundaries: "no L0 after N attempts / H hours" stops at the limit (the Nth attempt without L0 is the
last one); "a full run estimated at more than H hours" stops only above it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, ConfigDict

from ladder.checks.l4 import compile_seconds, median_step_time
from ladder.runs.records import RunRecord
from ladder.checks.results import CheckResult, LadderResult, Level, level_index

if TYPE_CHECKING:
    from ladder.migration.protocol import Protocol

JOURNAL_SO_FAR_SCHEMA = 1
DIVERGENCE_CHECKS = ("loss_window", "metric", "trend")


class AttemptSummary(BaseModel):
    model_config = ConfigDict(frozen=True)

    number: int
    started_at: float  # epoch seconds
    ended_at: float | None = None
    achieved_level: Level | None = None
    infrastructure: str | None = None  # its run failed for the machine or the connection: not an attempt of the port


class JournalSoFar(BaseModel):
    """What the stop rules need from a migration's journal."""

    model_config = ConfigDict(frozen=True)

    schema_version: int = JOURNAL_SO_FAR_SCHEMA
    migration_started_at: float
    attempts: list[AttemptSummary]

    def latest_time(self) -> float:
        times = [self.migration_started_at] + [t for a in self.attempts for t in (a.started_at, a.ended_at) if t]
        return max(times)


@dataclass(frozen=True)
class StopDecision:
    stop: bool
    rule: str
    reason: str
    evidence: dict[str, Any] = field(default_factory=dict)


def no_l0(journal: JournalSoFar, protocol: "Protocol", latest: RunRecord | None = None,
          now: float | None = None) -> StopDecision:
    """Stop when no attempt reached L0 within [limits].max_attempts_without_l0 attempts or max_hours_without_l0."""
    lim = protocol.limits
    if now is None:
        now = max([journal.latest_time()] + ([latest.ended_at or latest.started_at] if latest else []))
    hours = (now - journal.migration_started_at) / 3600.0
    reached = [a.number for a in journal.attempts if level_index(a.achieved_level) >= 0]
    # An attempt the infrastructure failed says nothing about the port: it is not an attempt without L0.
    infra = [a.number for a in journal.attempts if a.infrastructure and a.achieved_level is None]
    n = len(journal.attempts) - len(infra)
    ev = {"attempts": n, "hours": hours, "max_attempts": lim.max_attempts_without_l0,
          "max_hours": lim.max_hours_without_l0, "attempts_with_l0": reached, "infrastructure_failures": infra}
    if reached:
        return StopDecision(False, "no_l0", f"attempt {reached[0]} reached L0", ev)
    if n >= lim.max_attempts_without_l0:
        return StopDecision(True, "no_l0", f"no L0 after {n} attempts (limit {lim.max_attempts_without_l0})", ev)
    if hours >= lim.max_hours_without_l0:
        return StopDecision(True, "no_l0", f"no L0 after {hours:.2f} h (limit {lim.max_hours_without_l0:g} h)", ev)
    return StopDecision(False, "no_l0", f"no L0 yet: {n}/{lim.max_attempts_without_l0} attempts, "
                                        f"{hours:.2f}/{lim.max_hours_without_l0:g} h", ev)


def short_divergence(result: LadderResult | list[CheckResult]) -> StopDecision:
    """Stop when an L1 check (loss window, metric, trend) failed: beyond the protocol's thresholds (fixed
    rule) or beyond the seeds' noise (calibrated). Undecided checks do not stop: they ask for seeds."""
    checks = result.checks if isinstance(result, LadderResult) else result
    no_l0 = [c.name for c in checks if c.level == "L0" and c.status != "passed"]
    if no_l0:
        # No loss or metric to diverge: L1 fails for want of numbers, which is the no_l0 rule's business.
        return StopDecision(False, "short_divergence", f"the run did not reach L0 ({', '.join(no_l0)}): "
                                                       "nothing to compare", {"l0_not_passed": no_l0})
    l1 = [c for c in checks if c.level == "L1" and c.name in DIVERGENCE_CHECKS]
    ev = {c.name: {"status": c.status, "measured": c.measured, "evidence": c.evidence[:300]} for c in l1}
    failed = [c for c in l1 if c.status == "failed"]
    if failed:
        return StopDecision(True, "short_divergence", "short run diverged from the baseline: " +
                            "; ".join(f"{c.name}: {c.evidence[:160]}" for c in failed), ev)
    if not l1:
        return StopDecision(False, "short_divergence", "no L1 results to judge (no baseline to compare with?)", ev)
    undecided = [c.name for c in l1 if c.status == "undecided"]
    if undecided:
        return StopDecision(False, "short_divergence", f"undecided ({', '.join(undecided)}): add baseline seeds "
                                                       "before judging", ev)
    return StopDecision(False, "short_divergence", "loss window, metric and trend within the thresholds", ev)


def still_undecided(result: LadderResult | list[CheckResult]) -> StopDecision:
    """Stop when a calibrated check is still undecided after the supervisor added the seeds it asked for
    (up to max_seeds): the seeds cannot tell this run from the reference, a human decides."""
    checks = result.checks if isinstance(result, LadderResult) else result
    undecided = [c for c in checks if c.status == "undecided"]
    ev = {c.name: {"evidence": c.evidence[:300]} for c in undecided}
    if not undecided:
        return StopDecision(False, "undecided", "no undecided check", ev)
    names = ", ".join(f"{c.level}/{c.name}" for c in undecided)
    return StopDecision(True, "undecided", f"{names} still undecided with the baseline's seeds (max_seeds reached "
                        "or no spread): accept to take the attempt further, continue to try another", ev)


def full_run_estimate(short_run: RunRecord, full_steps: int, protocol: "Protocol") -> StopDecision:
    """Stop when median short-run step time x full steps + compile time exceeds [limits].max_full_run_hours.

    Compile time is the probe's when it measured one, else the start-up excess of the short run (time to
    its first loss line beyond what its steps at the median rate take): both are measured, never assumed.
    """
    lim = protocol.limits.max_full_run_hours
    step = median_step_time(short_run, protocol.l4.skip_first_intervals)
    if step is None:
        return StopDecision(False, "full_run_estimate", "cannot estimate: the short run has too few loss lines",
                            {"limit_hours": lim})
    compile_s, source = compile_seconds(short_run.probe), "probe"
    if compile_s is None:
        first = min(short_run.loss_curve, key=lambda p: p.step)
        compile_s, source = max(0.0, first.t - first.step * step), "start-up before the first loss line"
    est_h = (step * full_steps + compile_s) / 3600.0
    ev = {"median_step_s": step, "full_steps": full_steps, "compile_s": compile_s, "compile_source": source,
          "estimate_hours": est_h, "limit_hours": lim}
    text = (f"full run estimated at {est_h:.2f} h ({step:.4g} s/step x {full_steps} steps + {compile_s:.0f} s "
            f"compile from the {source})")
    return StopDecision(est_h > lim, "full_run_estimate", f"{text}, limit {lim:g} h", ev)


def stop_decisions(journal: JournalSoFar, protocol: "Protocol", latest: RunRecord | None = None,
                   latest_result: LadderResult | None = None, full_steps: int | None = None,
                   now: float | None = None) -> list[StopDecision]:
    """Every rule that applies to the inputs given; the supervisor stops if any says stop."""
    out = [no_l0(journal, protocol, latest, now)]
    if latest_result is not None:
        out.append(short_divergence(latest_result))
        out.append(still_undecided(latest_result))
    if latest is not None and latest.kind == "short" and full_steps:
        out.append(full_run_estimate(latest, full_steps, protocol))
    return out
