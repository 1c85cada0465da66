"""The journal's CLI on a real migration: real runs of the tiny fixture, journaled as the supervisor
journals them, then verified, tampered with, declared on, reviewed, audited and reported."""

from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import cli_json, workspace
from ladder._cli.check import check_run
from ladder.journal import Journal
from ladder.journal.entries import (
    append_attempt,
    append_baseline,
    append_decision,
    append_migration,
    append_stop,
    declare,
)
from ladder.journal.notes import record_checked_run
from ladder.migration.spec import load_spec

# The lead registers the group in ladder/_cli/commands.py; importing it here makes these tests
# independent of that line.
_RUN = ("import sys; from ladder._cli import journal; from ladder._cli.main import main; "
        "sys.argv = ['ladder', *sys.argv[1:]]; main()")


def ladder(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "LADDER_PLAIN": "1"}
    env.pop("ANTHROPIC_API_KEY", None)
    return subprocess.run([sys.executable, "-c", _RUN, *args], cwd=cwd, env=env, capture_output=True, text=True,
                          timeout=300)


def build_migration(root: Path) -> Path:
    """A tiny migration with three attempts of real runs: a silent L1 divergence, a crash, a clean port.

    Returns the workspace; its journal is journals/tiny/journal.sqlite.
    """
    ws = workspace(root)
    cli_json("baseline", "--short-only", "--seeds", "3", cwd=ws)  # min_seeds: calibrated verdicts
    spec = load_spec(ws / "ladder.toml")
    base_dir = sorted((ws / "baselines" / "tiny").glob("v*"))[-1]
    ports = {}
    for name, edit in (("smooth", ("default=0.0)", "default=0.05)")), ("crash", ("default=-1)", "default=60)")),
                       ("clean", ("", ""))):
        src = root / f"port-{name}"
        src.mkdir()
        (src / "train.py").write_text((ws / "train.py").read_text().replace(*edit, 1) if edit[0] else
                                      (ws / "train.py").read_text())
        ports[name] = src
    with Journal(spec.journal_dir / "journal.sqlite") as j:
        append_migration(j, name="tiny", spec_path="ladder.toml", protocol="ncsu", reference_platform="cpu",
                         target_platform="cpu", started_at=1000.0)
        append_baseline(j, base_dir, root=ws)
        for n, (name, declared) in enumerate((("smooth", "L2"), ("crash", "L1"), ("clean", "L1")), start=1):
            append_attempt(j, n, agent="scripted", parent=n - 1 or None, branch=f"attempt-{n}", commit=f"{n:040d}",
                           diff_stat="1 file changed", summary=f"port variant {name}", started_at=1000.0 + 100 * n)
            declare(j, n, declared, f"I expect {declared} for {name}")
            run = cli_json("run", "--on", "target", "--source", str(ports[name]), cwd=ws)
            result = check_run(Path(run["run_dir"]), ws / "ladder.toml", None)
            record_checked_run(j, n, Path(run["run_dir"]), result, root=ws)
            if name == "crash":
                append_decision(j, rule="no L0", reason="a crash: ask the human", decision="continue", by="human")
        append_stop(j, reason="reached L1", final_level="L1")
    return ws


pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def migration(tmp_path_factory) -> Path:
    return build_migration(tmp_path_factory.mktemp("mig"))


def test_verify_passes_then_names_an_edited_entry_and_an_edited_run_dir(migration: Path, tmp_path: Path) -> None:
    ok = ladder("journal", "verify", "--json", cwd=migration)
    assert ok.returncode == 0, ok.stderr
    assert json.loads(ok.stdout)["ok"] is True

    import shutil

    ws = tmp_path / "copy"
    shutil.copytree(migration, ws)
    db = ws / "journals" / "tiny" / "journal.sqlite"
    conn = sqlite3.connect(db, isolation_level=None)
    conn.execute("DROP TRIGGER entries_no_update")
    seq = conn.execute("SELECT seq FROM entries WHERE kind = 'declaration' AND attempt = 1").fetchone()[0]
    conn.execute("UPDATE entries SET content = replace(content, '\"L2\"', '\"L1\"') WHERE seq = ?", (seq,))
    conn.close()
    bad = ladder("journal", "verify", cwd=ws)
    assert bad.returncode == 1
    assert f"first bad entry: {seq}" in bad.stderr and f"entry {seq} (declaration, attempt 1) was edited" in bad.stderr

    ws2 = tmp_path / "copy2"
    shutil.copytree(migration, ws2)
    run_dir = next((ws2 / "runs" / "tiny").iterdir())
    (run_dir / "run.json").write_text((run_dir / "run.json").read_text().replace('"exit_code": 1', '"exit_code": 0'))
    (run_dir / "stdout.log").write_text("rewritten\n")
    bad2 = json.loads(ladder("journal", "verify", "--json", cwd=ws2).stdout)
    assert bad2["ok"] is False and bad2["first_bad_seq"] is None
    assert any(f"ref runs/tiny/{run_dir.name}: edited: stdout.log" in p for p in bad2["problems"]), bad2["problems"]


def test_declare_is_sealed_before_checks_and_refused_after(migration: Path, tmp_path: Path) -> None:
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(migration, ws)
    late = ladder("declare", "L3", "--attempt", "2", "-m", "it works now", cwd=ws)
    assert late.returncode == 2 and "already has a check" in late.stderr
    early = ladder("declare", "L2", "--attempt", "4", "-m", "expect L2: no fallback left", "--json", cwd=ws)
    assert early.returncode == 0, early.stderr
    e = json.loads(early.stdout)
    assert e["author"] == "human" and e["content"]["level"] == "L2" and e["attempt"] == 4
    assert ladder("declare", "L7", "--attempt", "5", "-m", "x", cwd=ws).returncode == 2
    assert ladder("journal", "verify", cwd=ws).returncode == 0


def test_notes_markdown_json_and_fix(migration: Path, tmp_path: Path) -> None:
    import shutil

    ws = tmp_path / "ws"
    shutil.copytree(migration, ws)
    notes = json.loads(ladder("notes", "--json", cwd=ws).stdout)
    checks = {(n["attempt"], n["check"]) for n in notes}
    assert (1, "L1/loss_window") in checks and (2, "L0/finished") in checks
    crash = next(n for n in notes if n["check"] == "L0/finished")
    assert crash["silent"] is False and "RuntimeError: simulated crash in the training step" in crash["diagnosis"]
    smooth = next(n for n in notes if n["check"] == "L1/loss_window")
    assert smooth["silent"] is True and "higher than the baseline's" in smooth["diagnosis"] and smooth["fix"] == ""

    fixed = ladder("journal", "fix-note", str(smooth["seq"]), "-m", "label smoothing back to 0", "--attempt", "3",
                   cwd=ws)
    assert fixed.returncode == 0, fixed.stderr
    md = ladder("notes", cwd=ws).stdout
    assert f"### #{smooth['seq']} attempt 1: L1/loss_window (silent)" in md
    assert "- fix: label smoothing back to 0" in md and "- fix: (not yet recorded)" in md
    wrong = ladder("journal", "fix-note", "1", "-m", "x", cwd=ws)  # entry 1 is the migration entry
    assert wrong.returncode == 2 and "entry 1 is not a failure note" in wrong.stderr


def test_audit_and_report_commands(migration: Path, tmp_path: Path) -> None:
    a = json.loads(ladder("audit", "--json", cwd=migration).stdout)
    # declared L2 -> achieved L0 (smooth), L1 -> none (crash), L1 -> L2 (clean: cpu to cpu passes L2)
    assert a["attempts"] == 3 and a["judged"] == 3 and a["overclaims"] == 2, (a["matrix"], ladder("notes", cwd=migration).stdout)
    assert a["matrix"] == {"L2": {"L2": 0, "L0": 1, "none": 0}, "L1": {"L2": 1, "L0": 0, "none": 1}}
    assert a["mean_overclaim_levels"] == 2.0 and abs(a["mean_gap_levels"] - 1.0) < 1e-12  # (2 + 2 - 1) / 3
    assert a["failures"] == 2 and a["silent_failures"] == 1 and a["interventions"] == 1
    m = a["migrations"][0]
    assert [(s["level"], s["attempt"]) for s in m["milestones"]] == [("L0", 1), ("L2", 3), ("L3", None)]
    assert "overclaim rate: 67% (2 of 3" in ladder("audit", cwd=migration).stdout

    out = tmp_path / "r" / "report.html"
    p = ladder("report", "--html", str(out), "--json", cwd=migration)
    assert p.returncode == 0, p.stderr
    info = json.loads(p.stdout)
    assert info["journal_ok"] is True and info["problems"] == []
    assert out.is_file() and out.with_suffix(".md").is_file()
