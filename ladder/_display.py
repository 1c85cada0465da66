"""The display layer: rich on a terminal, plain lines when piped, under CI, or with --plain.

Library code never prints; it reports progress through callbacks that the CLI wires to this.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from collections import deque

from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table
from rich.text import Text

from ladder._progress import Narrator, loss_words

_STATE = {"plain": None}
TAIL_LINES = 3  # a build's output lines shown under its phase line on a terminal


def set_plain(plain: bool) -> None:
    _STATE["plain"] = plain


def is_plain() -> bool:
    if _STATE["plain"] is not None:
        return bool(_STATE["plain"])
    return not sys.stdout.isatty() or bool(os.environ.get("CI")) or bool(os.environ.get("LADDER_PLAIN"))


class Display:
    def __init__(self) -> None:
        self.plain = is_plain()
        self.out = Console(no_color=self.plain, highlight=False, soft_wrap=True)
        self.err = Console(stderr=True, no_color=self.plain, highlight=False, soft_wrap=True)

    def error(self, message: str) -> None:
        self.err.print(("error: " if self.plain else "[bold red]error:[/] ") + message, markup=not self.plain)

    def info(self, message: str) -> None:
        if self.plain:
            self.err.print(message, markup=False)
        else:
            self.err.print(message)

    def json(self, obj: Any) -> None:
        sys.stdout.write(json.dumps(obj, indent=2, default=str) + "\n")

    def table(self, title: str, columns: list[str], rows: list[list[Any]]) -> None:
        if self.plain:
            print(title)
            print("\t".join(columns))
            for r in rows:
                print("\t".join("" if c is None else str(c) for c in r))
            return
        t = Table(title=title, show_lines=False)
        for c in columns:
            t.add_column(c, overflow="fold")
        for r in rows:
            t.add_row(*("" if c is None else str(c) for c in r))
        self.out.print(t)

    @contextmanager
    def run_progress(self, label: str) -> Iterator[Any]:
        """Yields a progress callback `(event, data)` for ladder.runs.execute.execute_run and the builds of
        ladder.runs.envs: plain lines, or a live view with a line per run and a build's last output lines."""
        narrator = Narrator(label)
        if self.plain:
            yield _PlainLines(self.err, narrator)
            return
        with _TailProgress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                           TimeElapsedColumn(), console=self.err, transient=False) as prog:
            yield _LiveView(prog, narrator)


class _PlainLines:
    """One line per event; a run's loss about every tenth of the run."""

    def __init__(self, err: Console, narrator: Narrator) -> None:
        self.err, self.narrator = err, narrator
        self.buckets: dict[str, int] = {}

    def __call__(self, event: str, data: dict) -> None:
        line = self.narrator.line(event, data)
        if line is None or (event == "loss" and not self._new_tenth(data)):
            return
        self.err.print(line, markup=False)

    def _new_tenth(self, data: dict) -> bool:
        who = self.narrator.who(data)
        bucket = (data["step"] or 0) * 10 // max(data.get("steps") or 0, 1)
        if self.buckets.get(who) == bucket:
            return False
        self.buckets[who] = bucket
        return True


class _TailProgress(Progress):
    """rich's Progress, with the last lines an environment build printed shown under its bars."""

    def __init__(self, *columns: Any, **kwargs: Any) -> None:
        self.tail: deque[str] = deque(maxlen=TAIL_LINES)  # before Progress's own init, which renders once
        super().__init__(*columns, **kwargs)

    def get_renderables(self) -> Iterator[Any]:
        yield self.make_tasks_table(self.tasks)
        if self.tail:
            yield Text("\n".join(f"  {line[:200]}" for line in self.tail), style="dim")


class _LiveView:
    """A bar per run (step, loss, elapsed), a phase line while an environment builds, and the words of
    starts, ends and warnings printed above them."""

    def __init__(self, prog: _TailProgress, narrator: Narrator) -> None:
        self.prog, self.narrator = prog, narrator
        self.tasks: dict[str, TaskID] = {}

    def __call__(self, event: str, data: dict) -> None:
        line = self.narrator.line(event, data)
        if event.startswith("env_"):
            self._build(event, data, line)
        elif event == "loss":
            self._task(self.narrator.who(data), total=data.get("steps"), completed=data["step"],
                       info=loss_words(data))
        elif event in ("baseline_run", "start", "end"):
            info = {"baseline_run": "starting", "start": "running"}.get(event, f"exit {data.get('exit_code')}")
            self._task(self.narrator.who(data), info=info)
        if line and event != "loss" and not event.startswith("env_"):
            self.prog.console.print(line, markup=False, highlight=False)

    def _build(self, event: str, data: dict, line: str | None) -> None:
        if event == "env_output":
            self.prog.tail.append(data["line"])
        elif event == "env_built":
            self._done("environment")
            self.prog.console.print(line, markup=False, highlight=False)
        elif line:
            if event == "env_step":
                self.prog.tail.clear()
            self._task("environment", description=line, info="")

    def _task(self, key: str, **fields: Any) -> None:
        if key not in self.tasks:
            self.tasks[key] = self.prog.add_task(key, total=None, info="")
        self.prog.update(self.tasks[key], **fields)

    def _done(self, key: str) -> None:
        if key in self.tasks:
            self.prog.remove_task(self.tasks.pop(key))
        self.prog.tail.clear()


def display() -> Display:
    return Display()
