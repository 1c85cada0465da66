"""Stop rules at, below and above each limit of the protocol (ncsu: 10 attempts, 3 h, 5 h full run)."""

from __future__ import annotations

import numpy as np

from ladder.migration.protocol import load_protocol
from ladder.runs.records import LossPoint, Provenance, RunRecord
from ladder.checks.results import CheckResult, LadderResult
from ladder.supervisor.stoprules import (AttemptSummary, JournalSoFar, full_run_estimate, no_l0, short_divergence,
                              stop_decisions)

P = load_protocol("ncsu")
H = 3600.0


def journal(n: int, hours: float = 0.5, level_at: int | None = None) -> JournalSoFar:
    span = hours * H
    attempts = [AttemptSummary(number=i + 1, started_at=span * i / max(n, 1), ended_at=span * (i + 1) / max(n, 1),
                               achieved_level="L0" if level_at == i + 1 else None) for i in range(n)]
    return JournalSoFar(migration_started_at=0.0, attempts=attempts)


def short_run(step_s: float, startup_s: float = 10.0, probe: dict | None = None) -> RunRecord:
    steps = np.arange(10, 310, 10)
    return RunRecord(run_id="s", kind="short", profile="target", platform="xla", seed=0, command="x", cwd=".",
                     started_at=0.0, ended_at=startup_s + 300 * step_s, exit_code=0, timeout_s=600,
                     loss_curve=[LossPoint(step=int(s), loss=1.0, t=startup_s + s * step_s) for s in steps],
                     loss_lines=len(steps), metric=0.8, probe=probe, provenance=Provenance(source="."))


def test_no_l0_attempt_limit() -> None:
    assert P.limits.max_attempts_without_l0 == 10
    assert no_l0(journal(9), P).stop is False
    at = no_l0(journal(10), P)
    assert at.stop is True and "10 attempts" in at.reason and at.evidence["attempts"] == 10
    assert no_l0(journal(11), P).stop is True
    assert no_l0(journal(11, level_at=4), P).stop is False  # an L0 ends the rule's concern


def test_no_l0_time_limit() -> None:
    assert P.limits.max_hours_without_l0 == 3.0
    assert no_l0(journal(2, hours=2.99), P).stop is False
    assert no_l0(journal(2, hours=3.0), P).stop is True
    assert no_l0(journal(2, hours=3.5), P).stop is True
    assert no_l0(journal(2, hours=1.0), P, now=3.2 * H).stop is True  # an explicit clock overrides
    assert no_l0(journal(2, hours=3.5, level_at=1), P).stop is False


def _l1(statuses: dict[str, str]) -> LadderResult:
    checks = [CheckResult(level="L1", name=n, status=s, evidence=f"{n} says {s}")  # type: ignore[arg-type]
              for n, s in statuses.items()]
    return LadderResult(run_dir="r", achieved_level=None, checks=checks)


def test_short_divergence() -> None:
    ok = short_divergence(_l1({"loss_window": "passed", "metric": "passed", "trend": "passed"}))
    assert ok.stop is False
    for name in ("loss_window", "metric", "trend"):
        statuses = {"loss_window": "passed", "metric": "passed", "trend": "passed", name: "failed"}
        d = short_divergence(_l1(statuses))
        assert d.stop is True and name in d.reason
    undecided = short_divergence(_l1({"loss_window": "passed", "metric": "undecided", "trend": "passed"}).checks)
    assert undecided.stop is False and "seeds" in undecided.reason


def test_a_run_without_l0_is_not_a_divergence() -> None:
    crashed = _l1({"loss_window": "failed", "metric": "failed", "trend": "failed"})
    crashed.checks.insert(0, CheckResult(level="L0", name="finished", status="failed", evidence="exit code 1"))
    d = short_divergence(crashed)
    assert d.stop is False and "did not reach L0" in d.reason and d.evidence["l0_not_passed"] == ["finished"]
    crashed.checks[0] = CheckResult(level="L0", name="finished", status="passed", evidence="exit code 0")
    assert short_divergence(crashed).stop is True  # with L0 passed, the same L1 failures do stop


def test_short_divergence_on_the_fixed_thresholds_through_l1(tmp_path) -> None:
    # The real L1 checks with one baseline seed: 4.9% loss window difference passes, 5.1% stops.
    from ladder.baselines.store import Baseline, BaselineMeta
    from ladder.checks import CheckContext, run_ladder

    def rec(scale: float, seed: int) -> RunRecord:
        r = short_run(0.01)
        curve = [LossPoint(step=p.step, loss=scale * (2.0 - p.step / 300), t=p.t) for p in r.loss_curve]
        return r.model_copy(update={"seed": seed, "loss_curve": curve})
    meta = BaselineMeta(name="b", version=1, created_at=0.0, profile="reference", platform="cpu", seeds=[0],
                        full_seeds=[], spec_sha256="", protocol="ncsu")
    base = Baseline(tmp_path, meta, [rec(1.0, 0)], [])
    fixed = P.model_copy(update={"l1": P.l1.model_copy(update={"rule": "fixed"})})
    below = run_ladder(CheckContext(run=rec(1.049, 5), protocol=fixed, baseline=base), up_to="L1")
    above = run_ladder(CheckContext(run=rec(1.051, 5), protocol=fixed, baseline=base), up_to="L1")
    assert short_divergence(below).stop is False
    assert short_divergence(above).stop is True and "loss_window" in short_divergence(above).reason


def test_full_run_estimate_limit() -> None:
    assert P.limits.max_full_run_hours == 5.0
    full_steps = 100_000
    limit_step = (5.0 * H - 10.0) / full_steps  # with 10 s of start-up measured before the first line
    below = full_run_estimate(short_run(limit_step * 0.99), full_steps, P)
    at = full_run_estimate(short_run(limit_step), full_steps, P)
    above = full_run_estimate(short_run(limit_step * 1.01), full_steps, P)
    assert below.stop is False and at.stop is False and above.stop is True
    assert abs(at.evidence["estimate_hours"] - 5.0) < 1e-6 and at.evidence["compile_source"].startswith("start-up")
    # a measured compile time from the probe is added (and named as such)
    probe = {"processes": [{"xla": {"compile": {"count": 2, "total": 600e9}}}]}
    with_compile = full_run_estimate(short_run(limit_step * 0.99, probe=probe), full_steps, P)
    assert with_compile.stop is True and with_compile.evidence["compile_source"] == "probe"


def test_stop_decisions_collects_every_rule() -> None:
    ds = stop_decisions(journal(3), P, latest=short_run(0.01), latest_result=_l1({"metric": "failed"}),
                        full_steps=1000)
    assert [d.rule for d in ds] == ["no_l0", "short_divergence", "undecided", "full_run_estimate"]
    assert [d.stop for d in ds] == [False, True, False, False]


def test_still_undecided_asks_the_human() -> None:
    ds = {d.rule: d for d in stop_decisions(journal(3), P, latest_result=_l1({"metric": "undecided"}))}
    assert ds["undecided"].stop is True and "L1/metric" in ds["undecided"].reason
    assert ds["short_divergence"].stop is False
