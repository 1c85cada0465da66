"""The sealed journal on real SQLite files: tampering is caught and named, concurrent and killed
writers lose nothing and break nothing, and the protocol's declaration rule holds."""

from __future__ import annotations

import multiprocessing as mp
import os
import random
import signal
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

from ladder._util.errors import LadderError
from ladder._util.hashing import write_manifest
from ladder.journal import Journal, verify_journal
from ladder.journal.migrations import MIGRATIONS, applied_migrations, migrate

REPO = Path(__file__).resolve().parents[1]


def _raw(path: Path) -> sqlite3.Connection:
    """A plain connection, as a tamperer would use, with the append-only triggers dropped."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("DROP TRIGGER entries_no_update")
    conn.execute("DROP TRIGGER entries_no_delete")
    return conn


def _fill(path: Path, n: int = 8) -> None:
    with Journal(path) as j:
        j.append("migration", {"source": "torch", "target": "xla"}, author="human")
        for i in range(2, n + 1):
            j.append("run", {"i": i, "loss": 1.0 / i}, author="ladder", attempt=i % 3)


def _chain_problems(problems: list[str]) -> list[str]:
    return [p for p in problems if not p.startswith("trigger ")]


def test_append_reopen_verify(tmp_path: Path) -> None:
    path = tmp_path / "journals" / "m1" / "journal.sqlite"
    with Journal(path) as j:
        first = j.append("migration", {"source": "repo@abc"}, author="human")
        j.append("attempt", {"number": 1, "branch": "a1"}, author="agent", attempt=1)
        j.append("declaration", {"level": "L2", "rationale": "compiles once"}, author="agent", attempt=1)
        j.append("check", {"achieved_level": "L1"}, author="ladder", attempt=1)
    assert first.seq == 1 and first.prev_sha256 == "0" * 64

    with Journal(path) as j:  # reopening neither re-migrates nor loses anything
        entries = j.entries()
        assert [e.seq for e in entries] == [1, 2, 3, 4]
        assert [e.kind for e in entries] == ["migration", "attempt", "declaration", "check"]
        assert all(b.prev_sha256 == a.entry_sha256 for a, b in zip(entries, entries[1:]))
        assert j.entries(kind="check", attempt=1)[0].content == {"achieved_level": "L1"}
        assert j.entries(attempt=2) == []
        assert j.last("declaration", attempt=1).content["level"] == "L2"  # type: ignore[union-attr]
        assert j.last("stop") is None
        fifth = j.append("note_fix", {"note": 1}, author="human", attempt=1)
        assert fifth.seq == 5 and fifth.prev_sha256 == entries[-1].entry_sha256
        with sqlite3.connect(path) as raw:
            assert raw.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
            assert applied_migrations(raw) == [name for name, _ in MIGRATIONS]

    result = verify_journal(path)
    assert result.ok and result.entries == 5 and result.problems == [] and result.first_bad_seq is None


def test_triggers_refuse_update_and_delete(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path, 3)
    with sqlite3.connect(path) as raw:
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            raw.execute("UPDATE entries SET content = '{}' WHERE seq = 2")
        with pytest.raises(sqlite3.IntegrityError, match="append-only"):
            raw.execute("DELETE FROM entries WHERE seq = 3")
    assert verify_journal(path).ok


def test_one_edited_byte_is_caught_and_named(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    raw = _raw(path)
    content = raw.execute("SELECT content FROM entries WHERE seq = 5").fetchone()[0]
    edited = content.replace('"i":5', '"i":6')
    assert edited != content and len(edited) == len(content)
    raw.execute("UPDATE entries SET content = ? WHERE seq = 5", (edited,))
    raw.close()

    result = verify_journal(path)
    assert not result.ok and result.first_bad_seq == 5
    assert _chain_problems(result.problems) == ["entry 5 (run, attempt 2) was edited: content hash mismatch"]
    assert any("trigger entries_no_update was removed" in p for p in result.problems)


def test_edited_header_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    raw = _raw(path)
    raw.execute("UPDATE entries SET author = 'human' WHERE seq = 4")
    raw.close()
    result = verify_journal(path)
    assert result.first_bad_seq == 4
    assert _chain_problems(result.problems) == ["entry 4 (run, attempt 1) was edited: header hash mismatch"]


def test_rehashed_replacement_is_caught_at_the_replaced_entry(tmp_path: Path) -> None:
    # A tamperer who also recomputes the entry's own hashes still breaks the next entry's link.
    from ladder._util.hashing import canonical_json, sha256_bytes
    from ladder.journal import entry_sha256

    path = tmp_path / "journal.sqlite"
    _fill(path)
    with Journal(path) as j:
        old = j.entries()[2]
    raw = _raw(path)
    content = canonical_json({"i": 3, "loss": 0.01})
    c_sha = sha256_bytes(content)
    e_sha = entry_sha256(seq=3, kind=old.kind, author=old.author, created_at=old.created_at, attempt=old.attempt,
                         content_sha256=c_sha, prev_sha256=old.prev_sha256, corrects=None, reason=None)
    raw.execute("UPDATE entries SET content = ?, content_sha256 = ?, entry_sha256 = ? WHERE seq = 3",
                (content.decode(), c_sha, e_sha))
    raw.close()
    result = verify_journal(path)
    assert result.first_bad_seq == 3
    assert _chain_problems(result.problems) == [
        "entry 3 (run, attempt 0) was replaced: its hash no longer matches the link stored in entry 4"
    ]


def test_deleted_entry_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    raw = _raw(path)
    raw.execute("DELETE FROM entries WHERE seq = 6")
    raw.close()
    result = verify_journal(path)
    assert result.entries == 7 and result.first_bad_seq == 6
    assert _chain_problems(result.problems) == ["entry 6 deleted: seq jumps from 5 to 7"]


def test_deleted_last_entry_is_caught(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    raw = _raw(path)
    raw.execute("DELETE FROM entries WHERE seq = 8")
    raw.close()
    result = verify_journal(path)
    assert result.first_bad_seq == 8
    assert _chain_problems(result.problems) == ["entry 8 deleted: the journal once held entry 8, its last is 7"]


def test_swapped_entries_are_caught(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    _fill(path)
    raw = _raw(path)
    raw.execute("UPDATE entries SET seq = -1 WHERE seq = 3")
    raw.execute("UPDATE entries SET seq = 3 WHERE seq = 4")
    raw.execute("UPDATE entries SET seq = 4 WHERE seq = -1")
    raw.close()
    result = verify_journal(path)
    assert result.first_bad_seq == 3
    chain = _chain_problems(result.problems)
    assert chain[0] == ("entry 3 (run, attempt 1) was reordered: it was chained after the entry now at seq 4, "
                        "not after entry 2")
    assert chain[1].startswith("entry 4 (run, attempt 0) was reordered")


def test_altered_file_in_referenced_directory_is_named(tmp_path: Path) -> None:
    run_dir = tmp_path / "runs" / "r1"
    run_dir.mkdir(parents=True)
    (run_dir / "run.json").write_text('{"metric": 0.8653}')
    (run_dir / "stdout.log").write_text("step 1 loss 2.0\n")
    digest = write_manifest(run_dir)
    path = tmp_path / "journals" / "m" / "journal.sqlite"
    with Journal(path) as j:
        j.append("run", {"refs": [{"path": "runs/r1", "digest": digest}]}, author="ladder", attempt=2)
        j.append("run", {"refs": [{"path": str(run_dir), "digest": digest}]}, author="ladder", attempt=2)
    assert verify_journal(path, root=tmp_path).ok
    relative_without_root = verify_journal(path)
    assert relative_without_root.problems == [
        "entry 1 (run, attempt 2): ref runs/r1 is relative and no root was given to verify"
    ]

    (run_dir / "run.json").write_text('{"metric": 0.8489}')
    result = verify_journal(path, root=tmp_path)
    assert not result.ok and result.first_bad_seq is None  # the entries themselves are intact
    assert "entry 1 (run, attempt 2): ref runs/r1: edited: run.json" in result.problems
    assert f"entry 2 (run, attempt 2): ref {run_dir}: edited: run.json" in result.problems

    write_manifest(run_dir)  # re-sealing the directory changes its digest, which the journal holds
    result = verify_journal(path, root=tmp_path)
    assert result.problems[0] == (
        "entry 1 (run, attempt 2): ref runs/r1: MANIFEST.sha256 digest differs from the one recorded"
    )


def test_malformed_refs_refused_at_append(tmp_path: Path) -> None:
    with Journal(tmp_path / "journal.sqlite") as j:
        with pytest.raises(LadderError, match="digest"):
            j.append("run", {"refs": [{"path": "runs/r1", "digest": "abc"}]}, author="ladder", attempt=1)
        with pytest.raises(LadderError, match="must be a JSON object"):
            j.append("run", ["not", "a", "dict"], author="ladder", attempt=1)  # type: ignore[arg-type]
        with pytest.raises(LadderError, match="unknown journal entry kind"):
            j.append("verdict", {}, author="ladder")
        with pytest.raises(LadderError, match="unknown journal author"):
            j.append("run", {}, author="robot")
        assert j.entries() == []


def _append_many(path: str, writer: int, n: int, barrier: Any, counts: Any) -> None:
    barrier.wait(timeout=60)
    with Journal(Path(path)) as j:  # both open the fresh file at once: creation and migration race too
        barrier.wait(timeout=60)
        k = 0
        # each writer goes on until both have written n: however late the other is scheduled (a loaded
        # machine), their appends overlap in time
        while k < n or min(counts[0], counts[1]) < n:
            j.append("agent_cost", {"writer": writer, "k": k}, author="agent")
            k += 1
            counts[writer] = k
            time.sleep(0.0005)  # give the other writer a chance to win the lock, so appends really interleave
            if k > 50 * n:
                raise RuntimeError("the other writer never wrote")


def test_two_processes_appending_at_once_lose_nothing(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    ctx = mp.get_context("spawn")
    barrier = ctx.Barrier(2)
    counts = ctx.Array("i", [0, 0])
    procs = [ctx.Process(target=_append_many, args=(str(path), w, 200, barrier, counts)) for w in (0, 1)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=120)
    assert [p.exitcode for p in procs] == [0, 0]

    with Journal(path) as j:
        entries = j.entries()
    total = counts[0] + counts[1]
    assert min(counts[0], counts[1]) >= 200 and [e.seq for e in entries] == list(range(1, total + 1))
    for w in (0, 1):
        assert [e.content["k"] for e in entries if e.content["writer"] == w] == list(range(counts[w]))
    writers = [e.content["writer"] for e in entries]
    switches = sum(a != b for a, b in zip(writers, writers[1:]))
    assert switches >= 20, f"the writers barely overlapped ({switches} switches): the test proved nothing"
    assert verify_journal(path).ok


_KILL_CHILD = """
import sys
from pathlib import Path
from ladder.journal import Journal
j = Journal(Path(sys.argv[1]))
k = 0
while True:
    j.append("run", {"k": k, "pad": "x" * 2000}, author="ladder", attempt=k % 5)
    k += 1
"""


def test_sigkilled_writer_leaves_a_journal_that_verifies(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    rng = random.Random(1234)
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    counts = []
    for _ in range(4):
        before = verify_journal(path).entries if path.exists() else 0
        child = subprocess.Popen([sys.executable, "-c", _KILL_CHILD, str(path)], env=env)
        deadline = time.time() + 30
        while time.time() < deadline:  # wait until it is really appending, then kill mid-loop
            if path.exists() and verify_journal(path).entries > before:
                break
            time.sleep(0.01)
        time.sleep(rng.uniform(0.0, 0.1))
        os.kill(child.pid, signal.SIGKILL)
        assert child.wait() == -signal.SIGKILL

        result = verify_journal(path)
        assert result.ok, result.problems
        assert result.entries > before
        counts.append(result.entries)
    with Journal(path) as j:  # the next writer continues the chain where the killed one stopped
        j.append("stop", {"why": "done"}, author="human")
    result = verify_journal(path)
    assert result.ok and result.entries == counts[-1] + 1


def test_declaration_after_check_is_refused(tmp_path: Path) -> None:
    with Journal(tmp_path / "journal.sqlite") as j:
        j.append("check", {"achieved_level": "L1"}, author="ladder", attempt=2)
        with pytest.raises(LadderError, match=r"attempt 2 already has a check \(entry 1\)") as err:
            j.append("declaration", {"level": "L3"}, author="agent", attempt=2)
        assert err.value.fix
        j.append("declaration", {"level": "L2"}, author="agent", attempt=3)  # other attempts are unaffected
        with pytest.raises(LadderError, match="needs its attempt number"):
            j.append("declaration", {"level": "L2"}, author="agent")
        assert [e.kind for e in j.entries()] == ["check", "declaration"]


def test_second_declaration_only_as_correction(tmp_path: Path) -> None:
    with Journal(tmp_path / "journal.sqlite") as j:
        first = j.append("declaration", {"level": "L3"}, author="agent", attempt=1)
        with pytest.raises(LadderError, match=r"already has a declaration \(entry 1\)"):
            j.append("declaration", {"level": "L2"}, author="agent", attempt=1)
        with pytest.raises(LadderError, match="no reason"):
            j.append("declaration", {"level": "L2"}, author="agent", attempt=1, corrects=first.seq)
        fixed = j.append("declaration", {"level": "L2"}, author="agent", attempt=1, corrects=first.seq,
                         reason="L3 needs the full run, which has not been run")
        assert j.last("declaration", attempt=1) == fixed
        j.append("check", {"achieved_level": "L2"}, author="ladder", attempt=1)
        with pytest.raises(LadderError, match="already has a check"):  # not even as a correction
            j.append("declaration", {"level": "L1"}, author="agent", attempt=1, corrects=fixed.seq, reason="r")


def test_corrections_point_at_old_entries(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    with Journal(path) as j:
        note = j.append("failure_note", {"cause": "clip before all-reduce", "silent": False}, author="agent",
                        attempt=4)
        j.append("run", {"k": 1}, author="ladder", attempt=4)
        fix = j.append("failure_note", {"cause": "clip before all-reduce", "silent": True}, author="human",
                       attempt=4, corrects=note.seq, reason="the run finished without any error")
        assert (fix.seq, fix.corrects, fix.reason) == (3, 1, "the run finished without any error")
        assert j.get(1) == note  # the corrected entry is kept as written
        with pytest.raises(LadderError, match="does not exist"):
            j.append("failure_note", {}, author="human", attempt=4, corrects=99, reason="r")
        with pytest.raises(LadderError, match="pass attempt=4"):
            j.append("failure_note", {}, author="human", attempt=5, corrects=note.seq, reason="r")
    assert verify_journal(path).ok
    raw = _raw(path)
    raw.execute("UPDATE entries SET corrects = 2 WHERE seq = 3")  # re-pointing a correction is an edit
    raw.close()
    assert _chain_problems(verify_journal(path).problems) == [
        "entry 3 (failure_note, attempt 4) was edited: header hash mismatch"
    ]


def test_migrations_apply_in_order_once(tmp_path: Path) -> None:
    path = tmp_path / "journal.sqlite"
    conn = sqlite3.connect(path, isolation_level=None)
    assert migrate(conn, MIGRATIONS[:1]) == ["m001_entries"]  # an older ladder's journal
    assert migrate(conn) == [name for name, _ in MIGRATIONS[1:]]
    assert migrate(conn) == []
    assert applied_migrations(conn) == [name for name, _ in MIGRATIONS]
    conn.execute("INSERT INTO _migrations (name, applied_at) VALUES ('m999_from_the_future', 0)")
    conn.close()
    with pytest.raises(LadderError, match="m999_from_the_future"):
        Journal(path)
