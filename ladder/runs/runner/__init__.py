"""Runners execute one command for ladder and stream its output back, line by line.

The contract every runner keeps (local today; a remote runner implements the same):
- the command runs in `cwd` (its own copy of the code) with exactly `env` (already scrubbed of secrets,
  with the probe injected), inside the sandbox the request names, with a private HOME;
- stdout and stderr come back line by line, timestamped from the run's start, and are written to
  `<stream>.log` in `log_dir` as they arrive (flushed, so a kill keeps them);
- a timeout, a cancellation (Ctrl-C, SIGTERM) or ladder's own death kills the whole process tree,
  including children that left the process group;
- the outcome says how it ended.
"""

from __future__ import annotations

import shlex
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

LineSink = Callable[[str, str, float], None]  # (stream, decoded line, seconds since start)
_SHELL = set("|&;<>()$`\\\"'*?[]~{}\n#=")


def command_argv(command: str) -> list[str]:
    """A command line as an argv: split and executed directly when it is a plain command, so signals and
    the parent-death signal reach the program itself; through /bin/sh only when it uses the shell."""
    try:
        parts = shlex.split(command)
    except ValueError:
        return ["/bin/sh", "-c", command]
    if any(ch in _SHELL for ch in command.replace("'", "").replace('"', "")) or not parts:
        return ["/bin/sh", "-c", command]
    return parts


@dataclass(frozen=True)
class RunRequest:
    argv: list[str] | str  # a str is a command line (see command_argv)
    cwd: Path
    env: dict[str, str]
    log_dir: Path
    timeout_s: float
    grace_s: float = 5.0
    sandbox: str = "none"  # "bwrap" or "none" (ladder.runs.runner.sandbox.resolve decides)
    read_only: tuple[Path, ...] = ()  # what a sandboxed run may read besides the system
    writable: tuple[Path, ...] = ()  # what it may write (its run directory)


@dataclass
class RunOutcome:
    exit_code: int | None
    started_at: float
    ended_at: float
    timed_out: bool = False
    killed_by_signal: int | None = None
    log_files: dict[str, str] = field(default_factory=dict)
    pid: int | None = None


class Runner(Protocol):
    name: str

    def execute(self, request: RunRequest, on_line: LineSink) -> RunOutcome: ...


def get_runner(name: str) -> Runner:
    from ladder.runs.runner.local import LocalRunner

    runners: dict[str, type] = {"local": LocalRunner}
    if name not in runners:
        from ladder._util.errors import LadderError

        raise LadderError(f"unknown runner {name!r}", f"use one of {sorted(runners)}")
    return runners[name]()
