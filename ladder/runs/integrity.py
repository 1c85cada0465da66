"""The run side of the probe's integrity facts: the roots a run may open files under, and the facts read
back from its per-process reports.

Owns: which directories count as the run's own (its run directory and copy of the code, its environment,
the Python installation, the probe, the mounts, the system's directories) and the merge of what the
probe's `integrity` module saw. Must not: judge (ladder.grade.integrity does), or import a framework.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ladder.runs.records import RunRecord
from ladder.runs.runner.sandbox import SYSTEM_RO

# Besides the system's read-only directories: the kernel's files, devices and the sandbox's private home. Not
# /tmp: a workspace may lie there; files opened under it are recorded (only forbidden roots are violations).
RUNTIME_ROOTS = ("/proc", "/dev", "/run", "/home/ladder-run")


def allowed_roots(read_only: list[Path], writable: list[Path]) -> list[str]:
    """Directories a run may open files under, as the probe matches them (absolute, without a trailing /)."""
    out: list[str] = []
    for p in [*writable, *read_only, *map(Path, SYSTEM_RO), *map(Path, RUNTIME_ROOTS)]:
        for form in {str(p), str(p.resolve()) if p.exists() else str(p)}:
            form = form.rstrip("/") or "/"
            if form not in out:
                out.append(form)
    return out


def integrity_facts(record: RunRecord) -> dict[str, Any] | None:
    """What every process of the run opened outside its roots, and the files opened while an evaluation
    window was open; None when the probe did not watch (an older ladder, or no report)."""
    processes = (record.probe or {}).get("processes") or []
    sections = [p.get("integrity") for p in processes if isinstance(p, dict) and p.get("integrity")]
    if not sections:
        return None
    outside: dict[str, dict[str, Any]] = {}
    eval_reads: list[str] = []
    code_writes: list[str] = []
    eval_windows = 0
    overflow = 0
    for p in processes:
        eval_windows += len(p.get("eval_windows") or []) if isinstance(p, dict) else 0
    for s in sections:
        for item in s.get("outside") or []:
            outside.setdefault(str(item.get("path")), item)
        for key, into in (("eval_reads", eval_reads), ("code_writes", code_writes)):
            into += [str(p) for p in s.get(key) or [] if str(p) not in into]
        overflow += int(s.get("overflow") or 0)
    return {"outside": list(outside.values()), "eval_reads": eval_reads, "code_writes": code_writes,
            "eval_windows": eval_windows, "overflow": overflow}
