"""Agents make one change per attempt in a worktree and declare the level they believe it reaches.

One small interface for all of them: ladder hands over the attempt's context (spec, journal so far,
last failure notes, the protocol prompt) and gets back a summary and a declared level with its
rationale. The agent never runs checks and never sees the baselines or the journal files directly;
ladder commits its change and verifies afterwards that protected paths did not change.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

from pydantic import BaseModel, Field

from ladder.checks.results import Level


class AttemptContext(BaseModel):
    migration: str
    attempt: int
    parent: int | None
    worktree: Path  # the agent's working directory: a git worktree on branch ladder/attempt-N
    target_platform: str
    reference_platform: str
    spec_text: str  # ladder.toml as written
    journal_summary: str  # attempts so far: declared vs achieved, one line each
    last_notes: list[dict[str, Any]] = Field(default_factory=list)  # failure notes of the parent attempt
    protocol_prompt: str = ""  # protocols/prompts/*.md, filled in
    short_command: str = ""


class AgentResult(BaseModel):
    summary: str = ""
    declared_level: Level | None = None
    rationale: str = ""
    error: str | None = None  # set when the agent failed to produce a valid declaration
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int | None = None


class Agent(Protocol):
    name: str

    def make_change(self, ctx: AttemptContext) -> AgentResult: ...


def make_agent(spec: str, workspace: Path) -> Agent:
    """`claude-code`, `scripted:FILE` or `human`."""
    from ladder._util.errors import LadderError

    if spec.startswith("scripted:"):
        from ladder.agents.scripted import ScriptedAgent

        path = Path(spec.split(":", 1)[1])
        return ScriptedAgent(path if path.is_absolute() else (workspace / path))
    if spec == "claude-code":
        from ladder.agents.claude_code import ClaudeCodeAgent

        return ClaudeCodeAgent()
    if spec == "human":
        from ladder.agents.human import HumanAgent

        return HumanAgent()
    raise LadderError(f"unknown agent {spec!r}", "use claude-code, scripted:FILE or human")
