"""The sealed journal of one migration: an append-only, hash-chained SQLite log.

This module owns writing entries and proving later that none was edited, deleted or
reordered, and that the baseline and run directories they reference are unchanged. It does not
decide what an entry means (the graph, the CLI and the checks do) beyond the rules that keep the
protocol honest: an attempt's declared level is written before its checks, once.

Each entry is hashed over canonical JSON of its header (which holds the content's hash and the
previous entry's hash), so editing one byte anywhere breaks the chain at that entry. Every append
is one `BEGIN IMMEDIATE` transaction that reads the chain head, applies the rules and inserts:
concurrent writers, in threads or processes, are serialised by SQLite and get consecutive seqs.

A chain alone cannot stop someone who rewrites every entry after an edit with the same function, or
who cuts the tail. Two defences: with LADDER_JOURNAL_KEY set when the journal is created, every entry
hash is an HMAC-SHA256 under that key (a rewrite without the key cannot verify); and each attempt's git
commit carries the journal head at that moment (`Journal-Head: <seq> <hash>`, ladder.supervisor.git_ops),
which `verify_journal` checks when it is given those anchors: a re-hashed or truncated journal no longer
holds the entries its commits recorded.
"""

from __future__ import annotations

import json
import re
import sqlite3
import threading
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ladder._util.errors import IntegrityError, LadderError
from ladder._util.hashing import canonical_json, manifest_digest, sha256_bytes, verify_manifest
from ladder.journal.migrations import MIGRATIONS, TRIGGERS, applied_migrations, migrate

Author = Literal["agent", "human", "ladder"]
AUTHORS: tuple[str, ...] = ("agent", "human", "ladder")
KINDS: tuple[str, ...] = (
    "migration",
    "baseline",
    "attempt",
    "declaration",
    "run",
    "check",
    "attempt_result",  # declared vs achieved level of a finished attempt (ladder.journal.entries)
    "failure_note",
    "note_fix",
    "decision",
    "agent_cost",
    "stop",
    "grade",  # `ladder grade`: rule-based judges of a finished migration, an optional LLM judge beside them
)
# Kinds that only make sense inside one attempt; the declaration rule needs the attempt number.
ATTEMPT_KINDS = frozenset({"attempt", "declaration", "check"})
GENESIS_SHA256 = "0" * 64
BUSY_TIMEOUT_S = 30.0
_HEX64 = re.compile(r"^[0-9a-f]{64}$")
_COLUMNS = (
    "seq, kind, author, created_at, attempt, content, content_sha256, prev_sha256, entry_sha256, corrects, reason"
)


class Entry(BaseModel):
    """One journal entry as stored. `content` is the parsed canonical JSON actually hashed."""

    model_config = ConfigDict(frozen=True)

    seq: int
    kind: str
    author: Author
    created_at: float
    attempt: int | None
    content: dict[str, Any]
    content_sha256: str
    prev_sha256: str
    entry_sha256: str
    corrects: int | None = None
    reason: str | None = None

    def label(self) -> str:
        """How messages name this entry: 'entry 7 (check, attempt 2)'."""
        return _label(self.seq, self.kind, self.attempt)


class VerifyResult(BaseModel):
    """Outcome of verify_journal. first_bad_seq is the first entry whose stored record fails;
    problems in referenced directories name their entry in the message but do not set it."""

    ok: bool
    entries: int
    problems: list[str]
    first_bad_seq: int | None = None

    def raise_if_bad(self, path: Path) -> None:
        if not self.ok:
            raise IntegrityError(
                f"{path}: journal failed verification ({len(self.problems)} problem(s)):\n  - "
                + "\n  - ".join(self.problems),
                "restore the journal and the referenced directories from a trusted copy; never repair them in place",
            )


KEY_ENV = "LADDER_JOURNAL_KEY"


def _key() -> bytes | None:
    import os

    k = os.environ.get(KEY_ENV)
    return k.encode() if k else None


def entry_sha256(
    *,
    key: bytes | None = None,
    seq: int,
    kind: str,
    author: str,
    created_at: float,
    attempt: int | None,
    content_sha256: str,
    prev_sha256: str,
    corrects: int | None,
    reason: str | None,
) -> str:
    """The entry's identity: sha256 (HMAC-SHA256 under `key`) of canonical JSON of its header (content
    enters via its hash)."""
    header = {
        "seq": seq,
        "kind": kind,
        "author": author,
        "created_at": created_at,
        "attempt": attempt,
        "content_sha256": content_sha256,
        "prev_sha256": prev_sha256,
        "corrects": corrects,
        "reason": reason,
    }
    if key is not None:
        import hashlib
        import hmac

        return hmac.new(key, canonical_json(header), hashlib.sha256).hexdigest()
    return sha256_bytes(canonical_json(header))


def _label(seq: int, kind: str, attempt: int | None) -> str:
    return f"entry {seq} ({kind})" if attempt is None else f"entry {seq} ({kind}, attempt {attempt})"


def _row_to_entry(row: tuple[Any, ...]) -> Entry:
    seq, kind, author, created_at, attempt, content, c_sha, prev, e_sha, corrects, reason = row
    return Entry(
        seq=seq,
        kind=kind,
        author=author,
        created_at=created_at,
        attempt=attempt,
        content=json.loads(content),
        content_sha256=c_sha,
        prev_sha256=prev,
        entry_sha256=e_sha,
        corrects=corrects,
        reason=reason,
    )


def _ref_problems(content: dict[str, Any]) -> list[str]:
    """Shape problems of content['refs'] (absent is fine)."""
    if "refs" not in content:
        return []
    refs = content["refs"]
    if not isinstance(refs, list):
        return ["refs must be a list of {'path': ..., 'digest': ...}"]
    problems = []
    for i, ref in enumerate(refs):
        if not isinstance(ref, dict) or not isinstance(ref.get("path"), str) or not ref.get("path"):
            problems.append(f"refs[{i}] needs a non-empty string 'path'")
        elif not isinstance(ref.get("digest"), str) or not _HEX64.match(ref["digest"]):
            problems.append(f"refs[{i}] ({ref['path']}) needs 'digest': the 64-hex sha256 of its MANIFEST.sha256")
    return problems


def _connect(path: Path) -> sqlite3.Connection:
    # Autocommit mode: every transaction is opened explicitly with BEGIN IMMEDIATE.
    conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False)
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return conn


def _switch_to_wal(conn: sqlite3.Connection) -> str:
    """Set WAL mode, retrying: SQLite does not call the busy handler for this switch, so two
    processes opening a fresh journal at the same moment would otherwise fail with 'locked'."""
    deadline = time.monotonic() + BUSY_TIMEOUT_S
    delay = 0.001
    while True:
        try:
            return str(conn.execute("PRAGMA journal_mode = WAL").fetchone()[0])
        except sqlite3.OperationalError as exc:
            if "locked" not in str(exc) and "busy" not in str(exc) or time.monotonic() > deadline:
                raise
            time.sleep(delay)
            delay = min(delay * 2, 0.1)


class Journal:
    """Append-only journal of one migration, stored at `path` (created and migrated on open).

    Safe to share between threads of one process (appends are serialised by a lock) and to open
    from several processes at once (appends are serialised by SQLite's write lock).
    """

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._conn = _connect(self.path)
        try:
            # WAL lets readers (verify, a watching CLI) read while a writer appends; it is
            # persistent in the file, so only the first open actually switches it.
            mode = _switch_to_wal(self._conn)
            if mode.lower() != "wal":
                raise LadderError(
                    f"{self.path}: SQLite refused WAL mode (got {mode!r})",
                    "keep the journal on a local file system (WAL needs shared memory)",
                )
            # FULL: a committed entry survives power loss, not only a killed process.
            self._conn.execute("PRAGMA synchronous = FULL")
            migrate(self._conn)
            self._key = _key()
            self._keyed = self._mode()
        except BaseException:
            self._conn.close()
            raise

    def _mode(self) -> bool:
        """Whether the chain is keyed: decided when the journal is created, then held to."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            row = self._conn.execute("SELECT value FROM meta WHERE key = 'keyed'").fetchone()
            if row is None:
                empty = self._conn.execute("SELECT COUNT(*) FROM entries").fetchone()[0] == 0
                keyed = bool(self._key) and empty
                self._conn.execute("INSERT INTO meta (key, value) VALUES ('keyed', ?)", ("1" if keyed else "0",))
            else:
                keyed = row[0] == "1"
            self._conn.execute("COMMIT")
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        return keyed

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self._conn.close()

    def append(
        self,
        kind: str,
        content: dict[str, Any],
        *,
        author: str,
        attempt: int | None = None,
        corrects: int | None = None,
        reason: str | None = None,
    ) -> Entry:
        """Append one entry in its own transaction and return it as stored.

        content is stored as canonical JSON (values JSON cannot hold are stored as str). A
        correction is a new entry with `corrects` = the corrected entry's seq and a `reason`;
        it must belong to the same attempt. Raises LadderError when a rule refuses the entry.
        """
        self._check_arguments(kind, content, author, attempt, corrects, reason)
        if self._keyed and self._key is None:
            raise LadderError(f"{self.path} is keyed (its entries are HMACs) and {KEY_ENV} is not set",
                              f"set {KEY_ENV} to the key the journal was created with")
        content_bytes = canonical_json(content)
        content_sha = sha256_bytes(content_bytes)
        with self._lock:
            self._conn.execute("BEGIN IMMEDIATE")
            try:
                head = self._conn.execute(
                    "SELECT seq, entry_sha256 FROM entries ORDER BY seq DESC LIMIT 1"
                ).fetchone()
                seq, prev = (1, GENESIS_SHA256) if head is None else (head[0] + 1, head[1])
                # Rules run inside the write lock so a concurrent check cannot slip in between.
                self._check_rules(kind, attempt, corrects)
                created_at = time.time()
                e_sha = entry_sha256(
                    key=self._key if self._keyed else None,
                    seq=seq,
                    kind=kind,
                    author=author,
                    created_at=created_at,
                    attempt=attempt,
                    content_sha256=content_sha,
                    prev_sha256=prev,
                    corrects=corrects,
                    reason=reason,
                )
                row = (seq, kind, author, created_at, attempt, content_bytes.decode(), content_sha, prev, e_sha,
                       corrects, reason)
                self._conn.execute(f"INSERT INTO entries ({_COLUMNS}) VALUES ({', '.join('?' * 11)})", row)
                self._conn.execute("COMMIT")
            except BaseException:
                self._conn.execute("ROLLBACK")
                raise
        return _row_to_entry(row)

    def head(self) -> tuple[int, str] | None:
        """(seq, entry hash) of the last entry; None for an empty journal."""
        with self._lock:
            row = self._conn.execute("SELECT seq, entry_sha256 FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        return None if row is None else (int(row[0]), str(row[1]))

    def entries(self, kind: str | None = None, attempt: int | None = None) -> list[Entry]:
        """Entries in seq order; kind and attempt filter when given (None = any)."""
        sql, args = f"SELECT {_COLUMNS} FROM entries WHERE 1", []
        if kind is not None:
            sql, args = sql + " AND kind = ?", [*args, kind]
        if attempt is not None:
            sql, args = sql + " AND attempt = ?", [*args, attempt]
        with self._lock:
            rows = self._conn.execute(sql + " ORDER BY seq", args).fetchall()
        return [_row_to_entry(r) for r in rows]

    def last(self, kind: str, attempt: int | None = None) -> Entry | None:
        """The latest entry of this kind (and attempt, when given); a correction, if one was made."""
        sql, args = f"SELECT {_COLUMNS} FROM entries WHERE kind = ?", [kind]
        if attempt is not None:
            sql, args = sql + " AND attempt = ?", [*args, attempt]
        with self._lock:
            row = self._conn.execute(sql + " ORDER BY seq DESC LIMIT 1", args).fetchone()
        return None if row is None else _row_to_entry(row)

    def get(self, seq: int) -> Entry | None:
        with self._lock:
            row = self._conn.execute(f"SELECT {_COLUMNS} FROM entries WHERE seq = ?", (seq,)).fetchone()
        return None if row is None else _row_to_entry(row)

    def _check_arguments(
        self,
        kind: str,
        content: dict[str, Any],
        author: str,
        attempt: int | None,
        corrects: int | None,
        reason: str | None,
    ) -> None:
        if kind not in KINDS:
            raise LadderError(f"unknown journal entry kind {kind!r}", f"use one of: {', '.join(KINDS)}")
        if author not in AUTHORS:
            raise LadderError(f"unknown journal author {author!r}", f"use one of: {', '.join(AUTHORS)}")
        if not isinstance(content, dict):
            raise LadderError(
                f"{kind} entry content must be a JSON object, got {type(content).__name__}",
                "pass a dict",
            )
        if kind in ATTEMPT_KINDS and attempt is None:
            raise LadderError(f"a {kind} entry needs its attempt number", f"append({kind!r}, ..., attempt=N)")
        if corrects is not None and not (reason and reason.strip()):
            raise LadderError(
                f"correction of entry {corrects} has no reason",
                "pass reason='what was wrong and why it is corrected'",
            )
        problems = _ref_problems(content)
        if problems:
            raise LadderError(f"{kind} entry has malformed refs: " + "; ".join(problems), "fix the refs list")

    def _check_rules(self, kind: str, attempt: int | None, corrects: int | None) -> None:
        """Rules that depend on what is already in the journal (called inside the write lock)."""
        if corrects is not None:
            old = self._conn.execute("SELECT kind, attempt FROM entries WHERE seq = ?", (corrects,)).fetchone()
            if old is None:
                raise LadderError(f"correction points at entry {corrects}, which does not exist",
                                  "pass corrects=<seq of an existing entry>")
            if old[1] != attempt:
                raise LadderError(
                    f"correction of {_label(corrects, old[0], old[1])} is for attempt {attempt}",
                    f"a correction belongs to the corrected entry's attempt: pass attempt={old[1]}",
                )
            if kind == "declaration" and old[0] != "declaration":
                raise LadderError(
                    f"a declaration can only correct a declaration, not {_label(corrects, old[0], old[1])}",
                    "append a correction of the same kind",
                )
        if kind != "declaration":
            return
        check = self._conn.execute(
            "SELECT seq FROM entries WHERE attempt = ? AND kind = 'check' ORDER BY seq LIMIT 1", (attempt,)
        ).fetchone()
        if check is not None:
            raise LadderError(
                f"attempt {attempt} already has a check (entry {check[0]}): its declared level must be "
                "written before any check runs, and cannot be changed after",
                "record what you now believe in a failure_note, or open a new attempt and declare before checking",
            )
        declared = self._conn.execute(
            "SELECT seq FROM entries WHERE attempt = ? AND kind = 'declaration' ORDER BY seq LIMIT 1", (attempt,)
        ).fetchone()
        if declared is not None and corrects is None:
            raise LadderError(
                f"attempt {attempt} already has a declaration (entry {declared[0]})",
                f"to change it before any check runs, append a correction: "
                f"append('declaration', ..., attempt={attempt}, corrects=<seq>, reason='why')",
            )


def _digests(where: Path) -> list[str]:
    """The digests a referenced directory may prove: its manifest's, and for an extended baseline version
    every earlier manifest's (ladder.baselines.store keeps them in history/)."""
    if (where / "baseline.json").is_file():
        from ladder.baselines.store import manifest_chain

        return manifest_chain(where)
    return [manifest_digest(where)]


def _verify_dir(where: Path) -> list[str]:
    if (where / "baseline.json").is_file():
        from ladder.baselines.store import verify_baseline

        return verify_baseline(where)
    return verify_manifest(where)


def _open_readonly(path: Path) -> sqlite3.Connection:
    conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=BUSY_TIMEOUT_S)
    conn.execute(f"PRAGMA busy_timeout = {int(BUSY_TIMEOUT_S * 1000)}")
    return conn


def verify_journal(path: Path, root: Path | None = None,
                   anchors: list[tuple[int, str, str]] | None = None) -> VerifyResult:
    """Recompute every hash and link of the journal at path and check every referenced directory.

    Names the first entry that was edited, deleted or reordered, and every referenced file that
    changed. Relative ref paths resolve against root. `anchors` are (seq, entry hash, where it was
    recorded) from outside the journal (the attempts' commits): each must still be in the chain, so a
    re-hashed or cut journal is caught. A keyed journal is checked with LADDER_JOURNAL_KEY. Opens the file
    read-only (SQLite may leave empty -wal/-shm side files next to it); nothing in the journal is changed.
    """
    path = Path(path)
    if not path.is_file():
        return VerifyResult(ok=False, entries=0, problems=[f"no journal at {path}"], first_bad_seq=None)
    conn = _open_readonly(path)
    try:
        names = applied_migrations(conn)
        problems = [f"schema: unknown migration {n!r} (written by a newer ladder?)"
                    for n in names if n not in {m for m, _ in MIGRATIONS}]
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'trigger')")}
        if "entries" not in tables:
            return VerifyResult(ok=False, entries=0, problems=[*problems, "no entries table"], first_bad_seq=None)
        problems += [f"trigger {t} was removed: entries were no longer protected from UPDATE/DELETE"
                     for t in TRIGGERS if t not in tables]
        rows = conn.execute(f"SELECT {_COLUMNS} FROM entries ORDER BY seq").fetchall()
        high = conn.execute("SELECT seq FROM sqlite_sequence WHERE name = 'entries'").fetchone()
        keyed_row = conn.execute("SELECT value FROM meta WHERE key = 'keyed'").fetchone() if "meta" in tables else None
    finally:
        conn.close()

    keyed = keyed_row is not None and keyed_row[0] == "1"
    key = _key()
    if keyed and key is None:
        return VerifyResult(ok=False, entries=len(rows), first_bad_seq=None, problems=[
            *problems, f"the journal is keyed (its entries are HMACs): set {KEY_ENV} to verify it"])
    if key is not None and not keyed:
        problems.append(f"{KEY_ENV} is set but the journal says it was written without a key: it may have been "
                        "re-hashed (or it was started without the key)")
    chain_problems, first_bad = _chain_problems(rows, None if high is None else high[0], key if keyed else None)
    problems += chain_problems
    by_seq = {r[0]: r[8] for r in rows}
    last = rows[-1][0] if rows else 0
    for seq, sha, where in anchors or []:
        if seq > last:
            problems.append(f"the journal ends at entry {last}, but {where} recorded entry {seq}: entries were cut off")
            first_bad = last + 1 if first_bad is None else min(first_bad, last + 1)
        elif by_seq.get(seq) != sha:
            problems.append(f"entry {seq} is not the one {where} recorded: the journal was rewritten")
            first_bad = seq if first_bad is None else min(first_bad, seq)
    for row in rows:
        problems += _entry_ref_problems(row, root)
    return VerifyResult(ok=not problems, entries=len(rows), problems=problems, first_bad_seq=first_bad)


def _chain_problems(rows: list[tuple[Any, ...]], high_seq: int | None,
                    key: bytes | None = None) -> tuple[list[str], int | None]:
    """One problem at most per entry, in seq order, and the seq of the first bad entry."""
    stored_hash_to_seq = {r[8]: r[0] for r in rows}
    problems: list[str] = []
    first_bad: int | None = None

    def bad(seq: int, message: str) -> None:
        nonlocal first_bad
        problems.append(message)
        first_bad = seq if first_bad is None else min(first_bad, seq)

    expected_seq, prev = 1, GENESIS_SHA256
    prev_row: tuple[Any, ...] | None = None
    for row in rows:
        seq, kind, author, created_at, attempt, content, c_sha, prev_sha, e_sha, corrects, reason = row
        name = _label(seq, kind, attempt)
        if seq != expected_seq:
            missing = f"entry {expected_seq}" if seq == expected_seq + 1 else f"entries {expected_seq}-{seq - 1}"
            bad(expected_seq, f"{missing} deleted: seq jumps from {expected_seq - 1} to {seq}")
        elif prev_sha != prev:
            if prev_sha in stored_hash_to_seq and stored_hash_to_seq[prev_sha] != seq:
                bad(seq, f"{name} was reordered: it was chained after the entry now at seq "
                         f"{stored_hash_to_seq[prev_sha]}, not after entry {seq - 1}")
            elif prev_row is not None:
                # The predecessor's hash no longer matches the link written after it: the
                # predecessor was replaced wholesale (re-hashed), or something between was removed.
                bad(seq - 1, f"{_label(prev_row[0], prev_row[1], prev_row[4])} was replaced: its hash no "
                             f"longer matches the link stored in entry {seq}")
            else:
                bad(seq, f"{name} was edited: prev link of the first entry is not the genesis hash")
        elif sha256_bytes(content.encode()) != c_sha:
            bad(seq, f"{name} was edited: content hash mismatch")
        elif entry_sha256(key=key, seq=seq, kind=kind, author=author, created_at=created_at, attempt=attempt,
                          content_sha256=c_sha, prev_sha256=prev_sha, corrects=corrects, reason=reason) != e_sha:
            bad(seq, f"{name} was edited: header hash mismatch")
        elif not _is_json_object(content):
            bad(seq, f"{name} was edited: content is not a JSON object")
        elif corrects is not None and not (isinstance(corrects, int) and 0 < corrects < seq):
            bad(seq, f"{name} corrects entry {corrects}, which is not an earlier entry")
        expected_seq, prev, prev_row = seq + 1, e_sha, row
    last_seq = rows[-1][0] if rows else 0
    if high_seq is not None and high_seq > last_seq:
        gone = f"entry {high_seq}" if high_seq == last_seq + 1 else f"entries {last_seq + 1}-{high_seq}"
        bad(last_seq + 1, f"{gone} deleted: the journal once held entry {high_seq}, its last is {last_seq}")
    return problems, first_bad


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def _entry_ref_problems(row: tuple[Any, ...], root: Path | None) -> list[str]:
    seq, kind, attempt, content = row[0], row[1], row[4], row[5]
    try:
        data = json.loads(content)
    except ValueError:
        return []  # already reported by the chain check
    if not isinstance(data, dict):
        return []
    name = _label(seq, kind, attempt)
    shape = _ref_problems(data)
    if shape:
        return [f"{name}: {p}" for p in shape]
    problems = []
    for ref in data.get("refs", []):
        where = Path(ref["path"])
        if not where.is_absolute():
            if root is None:
                problems.append(f"{name}: ref {ref['path']} is relative and no root was given to verify")
                continue
            where = root / where
        if not where.is_dir():
            problems.append(f"{name}: ref {ref['path']}: directory is missing")
            continue
        if not (where / "MANIFEST.sha256").is_file():
            problems.append(f"{name}: ref {ref['path']}: MANIFEST.sha256 is missing")
            continue
        if ref["digest"] not in _digests(where):
            problems.append(f"{name}: ref {ref['path']}: MANIFEST.sha256 digest differs from the one recorded")
        problems += [f"{name}: ref {ref['path']}: {p}" for p in _verify_dir(where)]
    return problems
