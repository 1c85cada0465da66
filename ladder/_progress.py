"""Progress events in words: the lines a person reads while runs go on and environments build.

Pure text, no output: ladder._display decides where each line goes (a live view on a terminal, plain
lines when piped). The events are those of ladder.runs.execute (Progress) and ladder.runs.envs.
"""

from __future__ import annotations

import time
from typing import Callable


def duration(seconds: float | None) -> str:
    if seconds is None:
        return "?"
    s = int(round(seconds))
    if s < 60:
        return f"{seconds:.1f}s" if seconds < 10 else f"{s}s"
    if s < 3600:
        return f"{s // 60}m{s % 60:02d}s"
    return f"{s // 3600}h{s % 3600 // 60:02d}m"


def loss_words(data: dict) -> str:
    steps = data.get("steps")
    return f"step {data['step']}{f'/{steps}' if steps else ''} loss {data['loss']:.4g}"


def environment(data: dict) -> str:
    return f"the {data['name']} environment" if data.get("name") else "the environment"


def phase(data: dict) -> str:
    return f"building {environment(data)}: step {data['index']}/{data['total']}: {data['command']}"


def holder_words(holder: dict) -> str:
    if not holder.get("pid"):
        return "another process"
    since = time.strftime("%H:%M:%S", time.localtime(holder["since"])) if holder.get("since") else "?"
    return f"process {holder['pid']} on {holder.get('host', '?')} (`{holder.get('command', '?')}`, since {since})"


def _end(who: str, data: dict) -> str:
    took = duration(data.get("wall_s"))
    where = f"; run dir {data['run_dir']}"
    if data.get("infrastructure"):
        return f"{who}: the infrastructure failed ({data['infrastructure']}) after {took}{where}"
    if data.get("timed_out"):
        return f"{who}: timed out after {took}{where}"
    metric = data.get("metric")
    said = (f"{data.get('metric_name') or 'metric'} {metric:.6g}" if metric is not None
            else "no headline metric in its output")
    return f"{who}: finished in {took}, exit code {data.get('exit_code')}, {said}{where}"


def _start(who: str, data: dict) -> str:
    on = f" on {data['host']}" if data.get("host") else ""
    return f"{who}: started{on} (timeout {duration(data.get('timeout_s'))}); run dir {data['run_dir']}"


_SAY: dict[str, Callable[[str, dict], str]] = {
    "start": _start,
    "end": _end,
    "loss": lambda who, d: f"{who}: {loss_words(d)} ({duration(d.get('t'))})",
    "reuse": lambda who, d: f"{who}: complete from an earlier try, reused",
    "warning": lambda who, d: f"{who}: warning: {d['message']}",
    "env": lambda who, d: f"{who}: {d['message']}",
    "env_wait": lambda who, d: f"waiting for {holder_words(d.get('holder') or {})} to finish building "
                               f"{environment(d)}",
    "env_step": lambda who, d: phase(d),
    "env_output": lambda who, d: f"    {d['line']}",
    "env_quiet": lambda who, d: f"{phase(d)}: still running after {duration(d['seconds'])}",
    "env_built": lambda who, d: f"built {environment(d)} in {duration(d['seconds'])}: {d['python']}",
}


class Narrator:
    """Says each progress event as one line, naming the run it belongs to ("reference short seed 1")."""

    def __init__(self, label: str) -> None:
        self.label = label
        self.positions: dict[tuple, str] = {}  # a baseline's runs: (profile, kind, seed) -> "2/5"

    def who(self, data: dict) -> str:
        if "kind" not in data or "seed" not in data:
            return self.label
        key = (data.get("profile"), data["kind"], data["seed"])
        parts = (data.get("profile"), data["kind"], "seed", data["seed"])
        name = " ".join(str(part) for part in parts if part not in (None, ""))
        return f"{name} (run {self.positions[key]})" if key in self.positions else name

    def line(self, event: str, data: dict) -> str | None:
        if event in ("baseline_run", "reuse"):
            self.positions[(data.get("profile"), data["kind"], data["seed"])] = f"{data['index']}/{data['total']}"
        if event == "baseline_run":
            return None
        say = _SAY.get(event)
        return say(self.who(data), data) if say else None
