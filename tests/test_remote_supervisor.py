"""The supervisor with the target on the ssh runner: a remote run outlives a killed ladder and is followed, not
started again, by `ladder resume`; a run the infrastructure failed is retried on the same code and never counts
as an attempt without L0. The reference runs locally (each profile has its own runner)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from helpers import cli_json
from ladder.journal.store import Journal, verify_journal
from ladder.migration.protocol import load_protocol
from ladder.supervisor.stoprules import AttemptSummary, JournalSoFar, no_l0
from sshd import ssh_env, sshd, workspace  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _env(ssh_env) -> None:
    pass


def supervised(ws: Path) -> Path:
    """The workspace's repo as a git repository, and a scripted migration with attempt 0 only."""
    (ws / "migrations").mkdir()
    (ws / "migrations" / "none.toml").write_text('attempt0_on_pause = "continue"\n')
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "original"]):
        subprocess.run(cmd, cwd=ws / "repo", check=True, capture_output=True)
    return ws


def test_an_attempt_the_infrastructure_failed_is_not_an_attempt_without_l0() -> None:
    p = load_protocol()
    attempts = [AttemptSummary(number=i, started_at=float(i), infrastructure="preempted") for i in range(12)]
    d = no_l0(JournalSoFar(migration_started_at=0.0, attempts=attempts), p, now=60.0)
    assert d.stop is False and d.evidence["attempts"] == 0 and len(d.evidence["infrastructure_failures"]) == 12
    ported = attempts[:2] + [AttemptSummary(number=20 + i, started_at=1.0) for i in range(10)]
    assert no_l0(JournalSoFar(migration_started_at=0.0, attempts=ported), p, now=60.0).stop is True


@pytest.mark.slow
def test_infrastructure_failures_are_retried_on_the_same_code_then_recorded_as_such(tmp_path) -> None:
    ws = supervised(workspace(tmp_path, None, extra="[protocol_overrides.infrastructure]\nreconnect_tries = 1\n"
                              "reconnect_backoff_s = 0.1\nmax_retries = 1\n[protocol_overrides.limits]\n"
                              "max_attempts_without_l0 = 1\n"))
    st = cli_json("supervise", "--agent", "scripted:migrations/none.toml", "--seeds", "1", cwd=ws)
    assert st["finished"] and st["waiting_for"] is None, st  # no "no L0 after 1 attempt" pause
    j = Journal(ws / "journals" / "remote-test" / "journal.sqlite")
    runs = [e.content for e in j.entries("run", attempt=0)]
    assert [(Path(r["run_dir"]).name, r["infrastructure"]) for r in runs] == [
        ("attempt-0-short-try1", "connection_lost"), ("attempt-0-short-try2", "connection_lost")]
    (result,) = [e.content for e in j.entries("attempt_result", attempt=0)]
    assert result["achieved_level"] is None and result["infrastructure"] == "connection_lost"
    notes = [e.content for e in j.entries("failure_note", attempt=0)]
    assert [n["check"] for n in notes] == ["infrastructure/connection_lost"] and not notes[0]["silent"]
    assert not any(e.content.get("rule") == "no_l0" for e in j.entries("decision"))
    assert verify_journal(j.path, root=ws).ok


@pytest.mark.slow
def test_kill_9_of_ladder_then_resume_follows_the_remote_run_and_never_starts_it_again(tmp_path, sshd) -> None:
    ws = supervised(workspace(tmp_path, sshd, steps=200, sleep=0.03))
    log = open(ws / "supervise.out", "w")
    sup = subprocess.Popen([sys.executable, "-m", "ladder", "supervise", "--agent", "scripted:migrations/none.toml",
                            "--seeds", "1"], cwd=ws, stdout=log, stderr=subprocess.STDOUT,
                           env={**os.environ, "LADDER_PLAIN": "1"}, start_new_session=True)
    remote_runs = sshd.remote_root / "runs" / "remote-test"
    end = time.time() + 240
    started = []
    while time.time() < end and sup.poll() is None:
        started = [d for d in remote_runs.glob("attempt-0-short-try1-*") if (d / "stdout.log").exists()
                   and (d / "stdout.log").stat().st_size > 200]
        if started:
            break
        time.sleep(0.05)
    assert started, f"attempt 0's short run never started there: {(ws / 'supervise.out').read_text()[-2000:]}"
    os.kill(sup.pid, signal.SIGKILL)
    sup.wait()
    (remote,) = started
    assert not (remote / "exit.json").exists(), "the run was meant to be cut off mid-way"

    st = cli_json("resume", cwd=ws)
    assert st["finished"], st
    j = Journal(ws / "journals" / "remote-test" / "journal.sqlite")
    shorts = [e.content for e in j.entries("run", attempt=0) if e.content["kind"] == "short"]
    assert [(Path(r["run_dir"]).name, r["killed_by_supervisor_crash"], r["exit_code"]) for r in shorts] == [
        ("attempt-0-short-try1", False, 0)]
    assert len(list(remote_runs.glob("attempt-0-short-*/request.json"))) == 1  # started there once
    assert (remote / "exit.json").exists()
    from ladder.runs.records import RunRecord

    rec = RunRecord.load(ws / shorts[0]["run_dir"])
    assert [p.step for p in rec.loss_curve] == list(range(1, 201))
    assert any("not started again" in n for n in rec.notes)
    assert verify_journal(j.path, root=ws).ok


@pytest.mark.slow
def test_baseline_seeds_run_in_parallel_on_a_multi_accelerator_profile(tmp_path) -> None:
    from ladder.baselines.store import create_baseline
    from ladder.migration.spec import load_spec

    ws = workspace(tmp_path, None, steps=40, sleep=0.05)
    text = (ws / "ladder.toml").read_text().replace("[profiles.reference]\n", "[profiles.reference]\nparallel = 2\n")
    (ws / "ladder.toml").write_text(text)
    b = create_baseline(load_spec(ws / "ladder.toml"), seeds=2, full_seeds=0, short_only=True)
    a, c = b.short_runs
    assert a.exit_code == c.exit_code == 0
    assert max(a.started_at, c.started_at) < min(a.ended_at, c.ended_at), "the two seeds did not overlap"
