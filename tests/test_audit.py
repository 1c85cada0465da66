"""The audit of hand-built journals (real SQLite files) against numbers worked out by hand below."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from ladder.journal import Journal
from ladder.journal.audit import audit_markdown, audit_paths, load_history
from ladder.journal.entries import (
    CheckEntry,
    FailureNote,
    RunEntry,
    append,
    append_agent_cost,
    append_attempt,
    append_decision,
    append_migration,
    declare,
)

# attempt: (declared level or "-" for no declaration, achieved level or None, run wall times,
#           failure notes as silent flags (all of one run), None = no check entry)
ATTEMPTS = {
    1: ("L2", None, [100.0], [False, False]),   # crash: two notes of one loud failure
    2: ("L2", "L0", [200.0], [True]),           # silent L1 divergence
    3: ("L1", "L0", [150.0], [True, True]),     # declared L2 first, corrected to L1 before its check
    4: ("L2", "L1", [100.0], [True]),
    5: ("L3", "L2", [300.0], [True]),
    6: ("-", "L2", [50.0], []),                 # never declared: not judged
    7: ("L1", "L2", [100.0], []),               # under-claimed by one level
    8: ("L4", "L1", [200.0], [False]),
    9: ("L3", "L3", [100.0, 300.0], []),        # short and full run
    10: ("L4", "unchecked", [], []),            # declared, never checked: not judged
}


def _run(j: Journal, n: int, i: int, wall: float, kind: str = "short") -> str:
    run_dir = f"runs/m/a{n}-{i}"
    append(j, RunEntry(run_dir=run_dir, kind=kind, seed=0, profile="target", exit_code=0, timed_out=False,
                       killed=False, metric=0.9, wall_s=wall, digest="0" * 64, refs=[]), author="ladder", attempt=n)
    return run_dir


def build(path: Path, attempts: dict, decisions: int, costs: dict[int, float] | None = None) -> Path:
    with Journal(path) as j:
        append_migration(j, name=path.parent.name, spec_path="ladder.toml", protocol="ncsu",
                         reference_platform="cuda", target_platform="xla", started_at=0.0)
        for n, (declared, achieved, walls, notes) in attempts.items():
            append_attempt(j, n, agent="claude-code", parent=n - 1 or None, started_at=1000.0 * n)
            if n == 3:
                first = declare(j, n, "L2", "first guess")
                declare(j, n, "L1", "L2 was optimistic", corrects=first.seq, reason="re-read the diff")
            elif declared != "-":
                declare(j, n, declared, "because")
            dirs = [_run(j, n, i, w, "full" if i == 1 else "short") for i, w in enumerate(walls)]
            if achieved != "unchecked":
                append(j, CheckEntry(run_dir=dirs[0], kind="short", achieved_level=achieved, checks=[]),
                       author="ladder", attempt=n)
            for silent in notes:
                append(j, FailureNote(check="L1/loss_window", level="L1", cause="c", diagnosis="d", silent=silent,
                                      run_dir=dirs[0]), author="ladder", attempt=n)
            if costs and n in costs:
                append_agent_cost(j, n, input_tokens=1000, output_tokens=100, cost_usd=costs[n], turns=3)
        for k in range(decisions):
            append_decision(j, rule="no L0 after 10 attempts", reason=f"pause {k}", decision="continue", by="human")
    return path


@pytest.fixture
def ten(tmp_path: Path) -> Path:
    return build(tmp_path / "journals" / "ten" / "journal.sqlite", ATTEMPTS, decisions=3, costs={1: 1.5, 4: 2.25})


def test_audit_of_ten_attempts_matches_the_hand_count(ten: Path) -> None:
    a = audit_paths([ten])
    # judged: every attempt but 6 (no declaration) and 10 (no check) -> 8
    assert (a.attempts, a.judged) == (10, 8)
    # declared - achieved (none = -1): 1: 2-(-1)=3, 2: 2-0=2, 3: 1-0=1, 4: 2-1=1, 5: 3-2=1, 7: 1-2=-1, 8: 4-1=3, 9: 0
    assert a.overclaims == 6 and a.overclaim_rate == pytest.approx(6 / 8)
    assert a.mean_overclaim_levels == pytest.approx((3 + 2 + 1 + 1 + 1 + 3) / 6)
    assert a.mean_gap_levels == pytest.approx((3 + 2 + 1 + 1 + 1 - 1 + 3 + 0) / 8)
    assert a.matrix == {
        "L4": {"L3": 0, "L2": 0, "L1": 1, "L0": 0, "none": 0},
        "L3": {"L3": 1, "L2": 1, "L1": 0, "L0": 0, "none": 0},
        "L2": {"L3": 0, "L2": 0, "L1": 1, "L0": 1, "none": 1},
        "L1": {"L3": 0, "L2": 1, "L1": 0, "L0": 1, "none": 0},
    }
    # failed runs: attempts 1 (loud), 2, 3, 4, 5 (silent), 8 (loud) -> 4 of 6 silent
    assert (a.failures, a.silent_failures) == (6, 4) and a.silent_share == pytest.approx(4 / 6)
    assert a.interventions == 3 and a.interventions_per_migration == 3.0
    m = a.migrations[0]
    firsts = {s.level: s for s in m.milestones}
    # first L0: attempt 2, ends at 2000 + 200; runs 100 + 200
    assert (firsts["L0"].attempt, firsts["L0"].attempts, firsts["L0"].elapsed_s, firsts["L0"].run_s) == (2, 2, 2200, 300)
    # first L2: attempt 5, ends at 5000 + 300; runs 100 + 200 + 150 + 100 + 300
    assert (firsts["L2"].attempt, firsts["L2"].attempts, firsts["L2"].elapsed_s, firsts["L2"].run_s) == (5, 5, 5300, 850)
    # first L3: attempt 9, ends at 9000 + 100 + 300; runs 850 + 50 + 100 + 200 + 400
    assert (firsts["L3"].attempt, firsts["L3"].attempts, firsts["L3"].elapsed_s, firsts["L3"].run_s) == (9, 9, 9400, 1600)
    assert m.cost_usd == pytest.approx(3.75) and m.final_level == "L3"


def test_a_corrected_declaration_counts_as_corrected(ten: Path) -> None:
    h = load_history(ten)
    a3 = next(a for a in h.attempts if a.number == 3)
    assert a3.declared_level == "L1" and a3.declaration.rationale == "L2 was optimistic"


def test_audit_over_two_journals_pools_attempts(ten: Path, tmp_path: Path) -> None:
    other = build(tmp_path / "journals" / "two" / "journal.sqlite",
                  {1: ("L1", "L1", [10.0], []), 2: ("L2", "L0", [10.0], [True])}, decisions=1)
    a = audit_paths([ten, other])
    assert (a.attempts, a.judged, a.overclaims) == (12, 10, 7)
    assert a.overclaim_rate == pytest.approx(0.7)
    assert a.mean_overclaim_levels == pytest.approx((11 + 2) / 7)
    assert (a.failures, a.silent_failures) == (7, 5)
    assert a.interventions == 4 and a.interventions_per_migration == 2.0
    assert a.matrix["L1"] == {"L3": 0, "L2": 1, "L1": 1, "L0": 1, "none": 0}
    assert a.matrix["L2"]["L0"] == 2
    assert [m.name for m in a.migrations] == ["ten", "two"]
    two = {s.level: s.attempt for s in a.migrations[1].milestones}
    assert two == {"L0": 1, "L2": None, "L3": None}
    md = audit_markdown(a)
    assert "overclaim rate: 70% (7 of 10 judged attempts" in md and "| two | 2 | 1/2 | 1 (1) | 1 | L1 |" in md


def test_audit_cli_over_many_journals(ten: Path, tmp_path: Path) -> None:
    from test_journal_cli import ladder

    other = build(tmp_path / "journals" / "two" / "journal.sqlite", {1: ("L1", "L1", [10.0], [])}, decisions=0)
    p = ladder("audit", str(ten), str(other), "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    a = json.loads(p.stdout)
    assert a["attempts"] == 11 and a["judged"] == 9 and a["overclaims"] == 6
    missing = ladder("audit", str(tmp_path / "nope.sqlite"), cwd=tmp_path)
    assert missing.returncode == 2 and "no journal at" in missing.stderr


def test_attempt_result_overrides_what_the_checks_say(tmp_path: Path) -> None:
    from ladder.journal.entries import append_attempt_result

    path = build(tmp_path / "journals" / "r" / "journal.sqlite", {1: ("L2", "L2", [50.0], [])}, decisions=0)
    with Journal(path) as j:  # the supervisor judged the attempt on its full run: L1, after 70 s
        e = append_attempt_result(j, 1, declared_level="L2", achieved_level="L1", wall_s=70.0, ended_at=1070.0)
    assert e.content["overclaim"] == 1
    a = audit_paths([path])
    assert a.overclaims == 1 and a.matrix == {"L2": {"L1": 1}}
    assert a.migrations[0].milestones[0].elapsed_s == 1070.0


def test_plain_dict_writers_are_read_and_an_unreadable_entry_is_named(tmp_path: Path) -> None:
    """Entries appended as plain dicts (no schema_version, extra fields), as the supervisor writes them."""
    path = tmp_path / "journals" / "raw" / "journal.sqlite"
    with Journal(path) as j:
        j.append("migration", {"name": "raw", "spec_path": "s", "protocol": "ncsu", "reference_platform": "cpu",
                               "target_platform": "xla", "started_at": 0.0}, author="ladder")
        # attempt 0: the original code; ladder's own declaration makes no claim
        j.append("attempt", {"number": 0, "agent": "ladder", "started_at": 10.0}, author="ladder", attempt=0)
        j.append("declaration", {"level": None, "rationale": "no claim"}, author="ladder", attempt=0)
        j.append("attempt_result", {"kind": "short", "declared_level": None, "achieved_level": None, "overclaim": 0,
                                    "ended_at": 20.0}, author="ladder", attempt=0)
        # attempt 1: short run reached L2, the full run only L1: the full run's result is the attempt's
        j.append("attempt", {"number": 1, "agent": "scripted", "started_at": 100.0}, author="agent", attempt=1)
        j.append("declaration", {"level": "L3", "rationale": "r"}, author="agent", attempt=1)
        j.append("attempt_result", {"kind": "short", "declared_level": "L3", "achieved_level": "L2", "overclaim": 1,
                                    "ended_at": 150.0}, author="ladder", attempt=1)
        j.append("attempt_result", {"kind": "full", "declared_level": "L3", "achieved_level": "L1", "overclaim": 2,
                                    "ended_at": 400.0}, author="ladder", attempt=1)
        # attempt 2: rejected before any run; its note has no run
        j.append("attempt", {"number": 2, "agent": "scripted", "started_at": 500.0}, author="agent", attempt=2)
        j.append("declaration", {"level": "L1", "rationale": "r"}, author="agent", attempt=2)
        j.append("failure_note", {"check": "agent/protected", "level": "L0", "cause": "c", "diagnosis": "d",
                                  "fix": "", "silent": False, "run_dir": None}, author="ladder", attempt=2)
        j.append("attempt_result", {"kind": "short", "declared_level": "L1", "achieved_level": None,
                                    "ended_at": 510.0}, author="ladder", attempt=2)
        bad = j.append("decision", {"schema_version": 2, "rule": "r"}, author="human")
    a = audit_paths([path])
    assert (a.attempts, a.judged, a.overclaims) == (3, 2, 2)
    assert a.matrix == {"L3": {"L1": 1, "none": 0}, "L1": {"L1": 0, "none": 1}}
    assert (a.failures, a.silent_failures) == (1, 0)
    firsts = {s.level: (s.attempt, s.elapsed_s) for s in a.migrations[0].milestones}
    assert firsts == {"L0": (1, 400.0), "L2": (None, None), "L3": (None, None)}
    assert a.interventions == 0 and len(a.problems) == 1
    assert f"entry {bad.seq} (decision): unreadable content" in a.problems[0]
