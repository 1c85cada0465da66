"""Agents make one change per attempt in a worktree and declare the level they believe it reaches.

One small interface for all of them: ladder hands over the attempt's context (spec, journal so far,
last failure notes, the protocol prompt) and gets back a summary and a declared level with its
rationale. The agent never runs checks and never sees the baselines or the journal files directly;
ladder commits its change and verifies afterwards that protected paths did not change. What an agent
sees is decided here and in ladder.supervisor.steps.agent_feedback: its worktree, the spec's commands,
the journal's declared-vs-achieved summary, and of the attempt it builds on the checks' names and
statuses, the device facts of its run and its own logs; not the baseline's numbers nor the hidden target.
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
    # What the agent may know of the attempt it builds on (ladder.supervisor.steps.agent_feedback): the names and
    # statuses of its checks, the device facts of its run, its own logs; never the baseline's numbers.
    last_notes: list[dict[str, Any]] = Field(default_factory=list)
    protocol_prompt: str = ""  # protocols/prompts/*.md, filled in
    short_command: str = ""
    feedback_dir: Path | None = None  # the parent attempt's own run logs (read-only in the agent's sandbox)
    read_only: list[Path] = Field(default_factory=list)  # what the agent's sandbox may read besides the system
    session_minutes: float | None = None  # the protocol's wall-clock limit on one agent session


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


def make_agent(spec: str, workspace: Path, protocol: Any = None) -> Agent:
    """`claude-code`, `scripted:FILE` or `human`."""
    from ladder._util.errors import LadderError

    if spec.startswith("scripted:"):
        from ladder.agents.scripted import ScriptedAgent
        from ladder.migration.protocol import load_protocol

        path = Path(spec.split(":", 1)[1])
        return ScriptedAgent(path if path.is_absolute() else (workspace / path),
                             sandbox=(protocol or load_protocol()).agent.sandbox)
    if spec == "claude-code":
        from ladder.agents.claude_code import ClaudeCodeAgent
        from ladder.migration.protocol import load_protocol

        rules = (protocol or load_protocol()).agent
        return ClaudeCodeAgent(max_turns=rules.max_turns, max_budget_usd=rules.max_budget_usd, sandbox=rules.sandbox,
                               session_minutes=rules.session_minutes)
    if spec == "human":
        from ladder.agents.human import HumanAgent

        return HumanAgent()
    raise LadderError(f"unknown agent {spec!r}", "use claude-code, scripted:FILE or human")
