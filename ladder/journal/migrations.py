"""Ordered, named schema migrations for the journal database, recorded in `_migrations`.

Modelled on simonw/llm's `llm/migrations.py`: each migration is a function registered in order
with `@migration`; `migrate` applies, once each, those not yet recorded. A migration, once
released, is never edited or reordered: a change to the schema is a new migration at the end.
All pending migrations run in one `BEGIN IMMEDIATE` transaction, so two processes opening a
fresh journal at the same moment cannot both apply the same one, and a process killed
half-way leaves the schema as it was.
"""

from __future__ import annotations

import sqlite3
import time
from collections.abc import Callable, Sequence

from ladder._util.errors import LadderError

Migration = Callable[[sqlite3.Connection], None]

MIGRATIONS: list[tuple[str, Migration]] = []


def migration(fn: Migration) -> Migration:
    """Register fn as the next migration; its function name is its recorded name."""
    MIGRATIONS.append((fn.__name__, fn))
    return fn


def applied_migrations(conn: sqlite3.Connection) -> list[str]:
    """Names recorded in `_migrations`, in the order they were applied ([] for a fresh file)."""
    exists = conn.execute(
        "SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_migrations'"
    ).fetchone()
    if not exists:
        return []
    return [row[0] for row in conn.execute("SELECT name FROM _migrations ORDER BY rowid")]


def migrate(conn: sqlite3.Connection, migrations: Sequence[tuple[str, Migration]] | None = None) -> list[str]:
    """Apply pending migrations in order; return the names applied now.

    conn must be in autocommit mode (isolation_level=None): the transaction is managed here.
    A database that records a migration this ladder does not know was written by a newer
    ladder and is refused rather than guessed at.
    """
    todo = list(MIGRATIONS if migrations is None else migrations)
    known = {name for name, _ in MIGRATIONS} | {name for name, _ in todo}
    conn.execute("BEGIN IMMEDIATE")
    try:
        conn.execute("CREATE TABLE IF NOT EXISTS _migrations (name TEXT PRIMARY KEY, applied_at REAL NOT NULL)")
        done = applied_migrations(conn)
        unknown = [name for name in done if name not in known]
        if unknown:
            raise LadderError(
                f"journal schema has migrations this ladder does not know: {', '.join(unknown)}",
                "open this journal with the (newer) ladder version that wrote it",
            )
        applied_now = []
        for name, fn in todo:
            if name in done:
                continue
            fn(conn)
            conn.execute("INSERT INTO _migrations (name, applied_at) VALUES (?, ?)", (name, time.time()))
            applied_now.append(name)
        conn.execute("COMMIT")
    except BaseException:
        conn.execute("ROLLBACK")
        raise
    return applied_now


@migration
def m001_entries(conn: sqlite3.Connection) -> None:
    # AUTOINCREMENT keeps the highest seq ever written in sqlite_sequence, so verify can notice
    # a deleted last entry (which leaves no gap and no broken link behind it).
    conn.execute(
        """
        CREATE TABLE entries (
            seq INTEGER PRIMARY KEY AUTOINCREMENT,
            kind TEXT NOT NULL,
            author TEXT NOT NULL CHECK (author IN ('agent', 'human', 'ladder')),
            created_at REAL NOT NULL,
            attempt INTEGER NULL,
            content TEXT NOT NULL,
            content_sha256 TEXT NOT NULL,
            prev_sha256 TEXT NOT NULL,
            entry_sha256 TEXT NOT NULL,
            corrects INTEGER NULL REFERENCES entries(seq),
            reason TEXT NULL
        )
        """
    )
    # A careless tool is stopped here; a determined tamperer who drops these is caught by the
    # hash chain in verify_journal.
    conn.execute(
        """
        CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries
        BEGIN SELECT RAISE(ABORT, 'journal entries are append-only: append a correction instead'); END
        """
    )
    conn.execute(
        """
        CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries
        BEGIN SELECT RAISE(ABORT, 'journal entries are append-only: append a correction instead'); END
        """
    )


@migration
def m002_entries_attempt_kind_index(conn: sqlite3.Connection) -> None:
    # The declaration rule looks up (attempt, kind) inside every append's write lock.
    conn.execute("CREATE INDEX entries_attempt_kind ON entries (attempt, kind)")


@migration
def m003_meta(conn: sqlite3.Connection) -> None:
    # Facts about the journal itself, written once when it is created (e.g. whether its chain is keyed).
    conn.execute("CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL)")


TRIGGERS = ("entries_no_update", "entries_no_delete")
