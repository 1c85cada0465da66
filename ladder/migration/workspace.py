"""A migration workspace: who may write there, and what must not change behind ladder's back.

One writer at a time. Every command that writes (baseline, baseline extend, run, supervise, resume,
declare, reset, journal fix-note) holds an exclusive `fcntl` lock on `.ladder/lock` for as long as it
runs; a second writer is refused at once with who holds it (pid, command, since), and readers (status,
check, audit, report, verify) never wait. The kernel drops the lock when its holder dies, so a crash
never leaves the workspace locked.

Protected state. The spec, the protocol files, the stored baselines (their manifests, baseline.json and
run.json files) and the journal head are hashed before and after every run and every agent step: a
change is an integrity violation, whatever the sandbox did or did not stop.
"""

from __future__ import annotations

import fcntl
import json
import os
import sys
import time
from pathlib import Path
from typing import TYPE_CHECKING

from ladder._util.errors import LadderError
from ladder._util.hashing import diff_hashes, sha256_file

if TYPE_CHECKING:
    from ladder.migration.spec import Spec

LOCK_DIR = ".ladder"
# Paths, relative to a repository or workspace root, that an attempt's change must never touch: what ladder
# writes and what decides its verdicts. The one list (the supervisor's diff check, the agent's write guard).
PROTECTED_PATHS: tuple[str, ...] = ("baselines/", "journals/", "protocols/", ".ladder/", "ladder.toml")


class WorkspaceBusy(LadderError):
    exit_code = 2


class WorkspaceLock:
    """`with WorkspaceLock(workspace, "supervise"):` — exclusive for the duration, refused when held."""

    def __init__(self, workspace: Path, command: str) -> None:
        self.dir = Path(workspace) / LOCK_DIR
        self.command = command
        self._fh = None

    def __enter__(self) -> "WorkspaceLock":
        self.dir.mkdir(parents=True, exist_ok=True)
        fh = open(self.dir / "lock", "a+")
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            fh.close()
            raise WorkspaceBusy(f"workspace busy: {holder(self.dir.parent) or 'another ladder command'} is writing in "
                                f"{self.dir.parent}",
                                "wait for it to finish (`ladder status` reads without waiting), or stop it first") from None
        info = {"pid": os.getpid(), "command": self.command, "argv": sys.argv[1:8], "since": time.time()}
        tmp = self.dir / "lock.json.tmp"
        tmp.write_text(json.dumps(info))
        tmp.replace(self.dir / "lock.json")
        self._fh = fh
        return self

    def __exit__(self, *exc: object) -> None:
        if self._fh is not None:
            try:
                (self.dir / "lock.json").unlink(missing_ok=True)
            except OSError:
                pass
            fcntl.flock(self._fh, fcntl.LOCK_UN)
            self._fh.close()
            self._fh = None


def holder(workspace: Path) -> str | None:
    """Who holds the workspace's lock, in words; None when nobody does."""
    path = Path(workspace) / LOCK_DIR / "lock"
    if not path.exists():
        return None
    with open(path, "a+") as fh:
        try:
            fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
            fcntl.flock(fh, fcntl.LOCK_UN)
            return None
        except BlockingIOError:
            pass
    try:
        info = json.loads((Path(workspace) / LOCK_DIR / "lock.json").read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(info["since"]))
        return f"pid {info['pid']} (ladder {info['command']}, since {since})"
    except (OSError, ValueError, KeyError):
        return "another ladder command"


# ---------------------------------------------------------------- protected state

def protected_state(spec: "Spec") -> dict[str, str]:
    """path -> sha256 of everything a run or an agent must not change."""
    out: dict[str, str] = {}

    def add(p: Path) -> None:
        if p.is_file():
            out[str(p)] = sha256_file(p)

    if spec.path:
        add(spec.path)
    from ladder.migration.protocol import resolve_protocol_path

    try:
        add(resolve_protocol_path(spec.protocol, spec.workspace))
    except LadderError:
        pass
    for p in sorted((spec.workspace / "protocols").glob("*.toml")):
        add(p)
    base = spec.baselines_dir
    if base.is_dir():
        for version in sorted(base.iterdir()):
            if not version.is_dir() or version.name.startswith("."):
                continue
            for name in ("MANIFEST.sha256", "baseline.json"):
                add(version / name)
            for run in sorted(version.glob("*/run.json")):
                add(run)
        for extra in sorted(base.glob("*.toml")):  # a hidden target beside the versions
            add(extra)
    journal = spec.journal_dir / "journal.sqlite"
    if journal.is_file():
        out[f"{journal} (head)"] = journal_head(journal)
    return out


def journal_head(path: Path) -> str:
    import sqlite3

    try:
        conn = sqlite3.connect(f"{path.resolve().as_uri()}?mode=ro", uri=True, timeout=30)
        try:
            row = conn.execute("SELECT seq, entry_sha256 FROM entries ORDER BY seq DESC LIMIT 1").fetchone()
        finally:
            conn.close()
    except sqlite3.Error as e:
        return f"unreadable: {e}"
    return "empty" if row is None else f"{row[0]} {row[1]}"


def changes(before: dict[str, str], after: dict[str, str]) -> list[str]:
    return diff_hashes(before, after, ("deleted", "changed", "added"))
