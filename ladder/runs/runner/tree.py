"""A run's whole process tree: found, recorded, and killed, including children that left its process group.

Linux only (it reads /proc). ladder makes itself a child subreaper, so a run's orphaned descendants are
re-parented to ladder rather than to init and stay findable; a watcher thread records every descendant
(pid and kernel start time, so a reused pid is never mistaken for one of ours) in `pids.json` in the run
directory. Killing the tree signals the run's process group and every recorded descendant still alive.
`kill_recorded` does the same from the file alone: `ladder resume` uses it to end the runs of a
ladder that died before it could.
"""

from __future__ import annotations

import ctypes
import json
import os
import signal
import threading
import time
from pathlib import Path

PR_SET_CHILD_SUBREAPER = 36
PIDS_FILE = "pids.json"


def become_subreaper() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0)
    except OSError:
        pass


def _stat(pid: int) -> tuple[int, int] | None:
    """(ppid, start time in clock ticks) of a live, non-zombie process; None otherwise."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    if rest[0] in ("Z", "X"):
        return None
    return int(rest[1]), int(rest[19])


def _all() -> dict[int, tuple[int, int]]:
    out = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            st = _stat(int(d))
            if st is not None:
                out[int(d)] = st
    return out


class ProcessTree:
    """Watches the descendants of one process while it runs."""

    def __init__(self, root: int, record: Path | None = None, interval: float = 0.25) -> None:
        self.root = root
        st = _stat(root)
        self.known: dict[int, int] = {root: st[1] if st else 0}  # pid -> start time
        self.record = record
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._watch, args=(interval,), daemon=True)
        self._thread.start()

    def scan(self) -> None:
        procs = _all()
        parents: dict[int, list[int]] = {}
        for pid, (ppid, _) in procs.items():
            parents.setdefault(ppid, []).append(pid)
        frontier = [p for p in self.known if p in procs and procs[p][1] == self.known[p]]
        changed = False
        while frontier:
            pid = frontier.pop()
            for child in parents.get(pid, []):
                if child not in self.known:
                    self.known[child] = procs[child][1]
                    frontier.append(child)
                    changed = True
        if changed and self.record is not None:
            try:
                tmp = self.record.with_suffix(".tmp")
                tmp.write_text(json.dumps({"pids": [[p, s] for p, s in self.known.items()]}))
                tmp.replace(self.record)
            except OSError:
                pass

    def _watch(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.scan()
            except Exception:
                pass

    def alive(self) -> list[int]:
        return [p for p, s in self.known.items() if (st := _stat(p)) is not None and st[1] == s]

    def kill(self, grace: float = 3.0) -> None:
        """SIGTERM to the group and every descendant, then SIGKILL to whatever is left."""
        self.scan()
        _signal_all(self.root, self.alive(), signal.SIGTERM)
        deadline = time.time() + grace
        while time.time() < deadline and self.alive():
            time.sleep(0.05)
            self.scan()
        _signal_all(self.root, self.alive(), signal.SIGKILL)

    def stop(self) -> None:
        self._stop.set()


def _signal_all(root: int, pids: list[int], sig: int) -> None:
    try:
        os.killpg(root, sig)
    except (ProcessLookupError, PermissionError):
        pass
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_recorded(run_dir: Path) -> list[int]:
    """Kill what a run directory's pids.json lists that is still alive (same pid, same start time).
    Returns the pids signalled."""
    path = Path(run_dir) / PIDS_FILE
    try:
        pids = [(int(p), int(s)) for p, s in json.loads(path.read_text()).get("pids", [])]
    except (OSError, ValueError):
        return []
    alive = [p for p, s in pids if (st := _stat(p)) is not None and st[1] == s]
    for pid in alive:
        try:
            os.kill(pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
    return alive
