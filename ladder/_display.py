"""The display layer: rich on a terminal, plain lines when piped, under CI, or with --plain.

Library code never prints; it reports progress through callbacks that the CLI wires to this.
"""

from __future__ import annotations

import json
import os
import sys
from contextlib import contextmanager
from typing import Any, Iterator

from rich.console import Console
from rich.table import Table

_STATE = {"plain": None}


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
        """Yields a progress callback `(event, data)` for ladder.runs.execute.execute_run."""
        if self.plain:
            last = {"step": None}

            def cb(event: str, data: dict) -> None:
                if event == "loss":
                    # one line every ~10% of the run in plain mode
                    steps = data.get("steps") or 0
                    bucket = (data["step"] or 0) * 10 // max(steps, 1)
                    if bucket != last["step"]:
                        last["step"] = bucket
                        self.err.print(f"{label}: step {data['step']}/{steps} loss {data['loss']:.4g} "
                                       f"({data['t']:.1f}s)", markup=False)
                elif event in ("start", "end", "env", "baseline_run", "reuse"):
                    self.err.print(f"{label}: {event} " + " ".join(f"{k}={v}" for k, v in data.items()),
                                   markup=False)

            yield cb
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

        with Progress(TextColumn("[bold]{task.description}"), BarColumn(), TextColumn("{task.fields[info]}"),
                      TimeElapsedColumn(), console=self.err, transient=False) as prog:
            task = prog.add_task(label, total=None, info="starting")

            def cb(event: str, data: dict) -> None:
                if event == "loss":
                    prog.update(task, total=data.get("steps"), completed=data["step"],
                                info=f"step {data['step']} loss {data['loss']:.4g}")
                elif event == "env":
                    prog.update(task, info=f"environment: {data['message'][:80]}")
                elif event == "start":
                    prog.update(task, info="running")
                elif event == "baseline_run":
                    prog.update(task, description=f"{label} {data['run']} ({data['index']}/{data['total']})",
                                completed=0)
                elif event == "end":
                    prog.update(task, info=f"exit {data['exit_code']} metric {data['metric']}")

            yield cb


def display() -> Display:
    return Display()
