"""A scripted agent: replays a list of attempts from a TOML file (tests, demos, recorded migrations).

File format:

    attempt0_on_pause = "continue"        # decision to replay if attempt 0 pauses the graph

    [[attempt]]
    summary = "Move model and batches to the XLA device"
    declared_level = "L3"                 # or omit for no claim
    rationale = "Runs on XLA; numerics unchanged"
    on_pause = "continue"                 # decision replayed if this attempt pauses the graph
    delay_s = 0                           # pause after editing, like a real agent thinking
    files = { "train.py" = "attempts/1/train.py" }   # replace files (source relative to this TOML)
    patch = '''unified diff applied with `git apply`'''  # optional
    delete = ["old.py"]                   # optional
    commands = ["sh -c 'make data'"]      # optional: run in the worktree, exactly as the claude-code agent's Bash
                                          # tool runs (scrubbed environment, private HOME, the agent's sandbox);
                                          # their output is kept in the attempt's summary of commands

Each attempt really changes files in the worktree; ladder commits the change.
"""

from __future__ import annotations

import subprocess
import time
import tomllib
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from ladder._util.errors import LadderError
from ladder._util.validation import validate_or_raise
from ladder.agents import AgentResult, AttemptContext
from ladder.checks.results import Level


class ScriptedAttempt(BaseModel):
    model_config = ConfigDict(extra="forbid")
    summary: str
    declared_level: Level | None = None
    rationale: str = ""
    on_pause: str | None = None
    delay_s: float = Field(default=0.0, ge=0)
    files: dict[str, str] = Field(default_factory=dict)
    patch: str | None = None
    delete: list[str] = Field(default_factory=list)
    commands: list[str] = Field(default_factory=list)


class Script(BaseModel):
    model_config = ConfigDict(extra="forbid")
    attempt0_on_pause: str | None = None
    attempt: list[ScriptedAttempt] = Field(default_factory=list)


def load_script(path: Path) -> Script:
    if not path.exists():
        raise LadderError(f"no scripted migration at {path}", "pass --agent scripted:FILE with an existing TOML file")
    script = validate_or_raise(Script, tomllib.loads(path.read_text()), str(path))
    for i, a in enumerate(script.attempt, 1):
        for src in a.files.values():
            if not (path.parent / src).exists():
                raise LadderError(f"{path}: attempt {i} replaces a file from {src}, which does not exist",
                                  "fix the path (relative to the scripted file)")
    return script


class ScriptedAgent:
    name = "scripted"

    def __init__(self, path: Path, sandbox: str = "auto") -> None:
        self.path = path
        self.script = load_script(path)
        self.sandbox = sandbox
        self.outputs: list[tuple[str, int, str]] = []  # (command, exit code, output) of the last attempt

    def attempts(self) -> int:
        return len(self.script.attempt)

    def decision_after(self, attempt: int) -> str | None:
        if attempt == 0:
            return self.script.attempt0_on_pause
        if 1 <= attempt <= len(self.script.attempt):
            return self.script.attempt[attempt - 1].on_pause
        return None

    def make_change(self, ctx: AttemptContext) -> AgentResult:
        if ctx.attempt > len(self.script.attempt):
            return AgentResult(error=f"the script has no attempt {ctx.attempt} (it has {len(self.script.attempt)})")
        a = self.script.attempt[ctx.attempt - 1]
        for dst, src in a.files.items():
            target = ctx.worktree / dst
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes((self.path.parent / src).read_bytes())
        for rel in a.delete:
            (ctx.worktree / rel).unlink(missing_ok=True)
        if a.patch:
            p = subprocess.run(["git", "apply", "--whitespace=nowarn", "-"], input=a.patch, text=True,
                               cwd=ctx.worktree, capture_output=True)
            if p.returncode != 0:
                return AgentResult(error=f"scripted patch did not apply: {p.stderr.strip()}")
        self.outputs = [self._run(ctx, cmd) for cmd in a.commands]
        if a.delay_s:
            time.sleep(a.delay_s)
        return AgentResult(summary=a.summary, declared_level=a.declared_level, rationale=a.rationale)

    def _run(self, ctx: AttemptContext, command: str) -> tuple[str, int, str]:
        import shlex
        import tempfile

        from ladder.agents.launch import agent_config, sandboxed_command

        with tempfile.TemporaryDirectory(prefix=f"ladder-scripted-{ctx.attempt}-") as session:
            cfg = agent_config(ctx, "/bin/sh", self.sandbox, Path(session))
            argv, env = sandboxed_command(cfg, shlex.split(command))
            p = subprocess.run(argv, cwd=ctx.worktree, env=env, capture_output=True, text=True, timeout=300)
        return command, p.returncode, (p.stdout + p.stderr)[-4000:]

    def as_dict(self) -> dict[str, Any]:
        return self.script.model_dump()
