"""Runners execute one command for ladder and stream its output back, line by line.

`local` runs on this machine. The interface is deliberately small (a request in, timestamped lines
out, an outcome at the end) so a remote runner (ssh, a cloud TPU VM, a batch queue) can implement it
without the rest of ladder changing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable, Protocol

LineSink = Callable[[str, str, float], None]  # (stream, decoded line, seconds since start)


@dataclass(frozen=True)
class RunRequest:
    argv: list[str] | str  # a str runs through the shell
    cwd: Path
    env: dict[str, str]
    log_dir: Path
    timeout_s: float
    grace_s: float = 5.0


@dataclass
class RunOutcome:
    exit_code: int | None
    started_at: float
    ended_at: float
    timed_out: bool = False
    killed_by_signal: int | None = None
    log_files: dict[str, str] = field(default_factory=dict)


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
