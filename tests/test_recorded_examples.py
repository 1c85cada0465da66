"""The recorded demo baseline and journal in baselines/ and journals/ verify, and read back as recorded."""

from __future__ import annotations

import json
import shutil
import sqlite3
from pathlib import Path

from helpers import ladder_cli

REPO = Path(__file__).resolve().parent.parent
BASELINE = REPO / "baselines" / "classifier-xla" / "v1"
JOURNAL = REPO / "journals" / "classifier-xla" / "journal.sqlite"


def _copy(tmp_path: Path) -> Path:
    # Work on a copy: opening a journal writes SQLite's -wal/-shm files beside it.
    ws = tmp_path / "ws"
    shutil.copytree(REPO / "baselines", ws / "baselines")
    shutil.copytree(REPO / "journals", ws / "journals")
    return ws


def test_recorded_baseline_and_journal_verify(tmp_path: Path) -> None:
    ws = _copy(tmp_path)
    b = ladder_cli("baseline", "verify", str(ws / BASELINE.relative_to(REPO)), "--json", cwd=ws)
    assert b.returncode == 0 and json.loads(b.stdout)["ok"] is True
    j = ladder_cli("journal", "verify", "--journal", str(ws / JOURNAL.relative_to(REPO)), "--json", cwd=ws)
    assert j.returncode == 0, j.stdout + j.stderr


def test_recorded_journal_audits_as_the_demo_ran(tmp_path: Path) -> None:
    ws = _copy(tmp_path)
    p = ladder_cli("audit", str(ws / JOURNAL.relative_to(REPO)), "--json", cwd=ws)
    audit = json.loads(p.stdout)
    assert audit["attempts"] == 4 and audit["migrations"][0]["final_level"] == "L3"
    assert audit["matrix"] == {"L3": {"L3": 1, "L1": 1, "L0": 1}}  # declared L3 three times


def test_tampering_with_the_recorded_journal_is_caught(tmp_path: Path) -> None:
    ws = _copy(tmp_path)
    path = ws / JOURNAL.relative_to(REPO)
    con = sqlite3.connect(path)
    con.execute("DROP TRIGGER IF EXISTS entries_no_update")
    for (name,) in con.execute("SELECT name FROM sqlite_master WHERE type = 'trigger'").fetchall():
        con.execute(f"DROP TRIGGER {name}")
    seq = con.execute("SELECT seq FROM entries WHERE kind = 'declaration' AND attempt = 2").fetchone()[0]
    con.execute("UPDATE entries SET content = replace(content, '\"L3\"', '\"L0\"') WHERE seq = ?", (seq,))
    con.commit()
    con.close()
    j = ladder_cli("journal", "verify", "--journal", str(path), "--json", cwd=ws)
    assert j.returncode == 1 and f"entry {seq}" in j.stdout
