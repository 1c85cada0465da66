"""The supervisor's bridge to the stop rules and the report: builds their inputs from the journal.

The rules themselves (ladder.supervisor.stoprules) are pure; this module only gathers what they need and
applies limits a human raised at an earlier pause.
"""

from __future__ import annotations

from typing import Any

from ladder.supervisor import stoprules
from ladder.migration.protocol import Protocol
from ladder.runs.records import RunRecord
from ladder.checks.results import CheckResult, LadderResult, highest_level
from ladder.supervisor import steps
from ladder.supervisor.steps import Migration

# Which protocol limit a "raise-limit" decision raises, per rule, and the default new value.
RAISABLE = {"no_l0": ("max_attempts_without_l0", 2.0), "full_run_estimate": ("max_full_run_hours", 2.0)}


def protocol_with_limits(protocol: Protocol, limits: dict[str, float]) -> Protocol:
    known = {k: v for k, v in (limits or {}).items() if k in type(protocol.limits).model_fields}
    if not known:
        return protocol
    current = protocol.limits.model_dump()
    current.update({k: type(current[k])(v) for k, v in known.items()})
    return protocol.model_copy(update={"limits": type(protocol.limits).model_validate(current)})


def journal_so_far(m: Migration) -> stoprules.JournalSoFar:
    mig = m.journal.last("migration")
    started = mig.content.get("started_at", mig.created_at) if mig else 0.0
    attempts = []
    for e in m.journal.entries("attempt"):
        results = m.journal.entries("attempt_result", attempt=e.attempt)
        best = highest_level(r.content.get("achieved_level") for r in results)
        infra = [r.content.get("infrastructure") for r in results]
        attempts.append(stoprules.AttemptSummary(
            number=e.attempt, started_at=e.content.get("started_at", e.created_at),
            ended_at=max((r.created_at for r in results), default=None), achieved_level=best,
            infrastructure=infra[-1] if infra and all(infra) else None))
    return stoprules.JournalSoFar(migration_started_at=started, attempts=attempts)


def _latest(m: Migration, n: int, kind: str | None = None) -> tuple[RunRecord | None, LadderResult | None]:
    """The attempt's latest judged run and its result: the full run's once it has one (or `kind`'s)."""
    entry = steps.check_entry(m, n, kind) if kind else (steps.check_entry(m, n, "full") or steps.check_entry(m, n, "short"))
    if entry is None:
        return None, None
    run = RunRecord.load(m.workspace / entry.content["run_dir"])
    result = LadderResult(run_dir=entry.content["run_dir"], achieved_level=entry.content["achieved_level"],
                          checks=[CheckResult.model_validate(c) for c in entry.content["checks"]])
    return run, result


def _limit_increment(protocol: Protocol, key: str, factor: float) -> float:
    return getattr(protocol.limits, key) * factor


def evaluate(m: Migration, n: int, state: dict[str, Any]) -> dict[str, Any] | None:
    """The first stop rule that says stop after attempt n, as a pause payload; None to go on."""
    protocol = protocol_with_limits(m.protocol, state.get("limits") or {})
    run, result = _latest(m, n)
    decisions = stoprules.stop_decisions(journal_so_far(m), protocol, latest=run, latest_result=result)
    # A human already answered this rule for this attempt (e.g. accepted a divergent short run whose
    # full run then failed): asking again would only repeat the question.
    answered = {e.content.get("rule") for e in m.journal.entries("decision", attempt=n)}
    for d in decisions:
        if d.stop and d.rule not in answered:
            out = {"rule": d.rule, "reason": d.reason, "evidence": d.evidence}
            if d.rule in RAISABLE:
                key, factor = RAISABLE[d.rule]
                out.update(limit_key=key, raised_default=_limit_increment(protocol, key, factor))
            return out
    return None


def full_run_estimate(m: Migration, n: int, state: dict[str, Any]) -> dict[str, Any] | None:
    """A pause payload when the full run of attempt n is estimated over the limit; None to go on."""
    protocol = protocol_with_limits(m.protocol, state.get("limits") or {})
    run, _ = _latest(m, n, "short")
    if run is None:
        return None
    d = stoprules.full_run_estimate(run, m.spec.experiment.full_steps, protocol)
    if not d.stop:
        return None
    key, factor = RAISABLE[d.rule]
    return {"rule": d.rule, "reason": d.reason, "evidence": d.evidence, "limit_key": key,
            "raised_default": _limit_increment(protocol, key, factor)}


def write_report(m: Migration) -> None:
    from ladder.report import write_report as _write

    _write(steps.journal_path(m.spec), m.spec.journal_dir / "report.html", root=m.workspace)
