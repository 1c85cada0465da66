"""The `claude-code` agent: one Claude Code session per attempt, through claude-agent-sdk.

This module owns turning an AttemptContext into a session (cwd = the attempt's worktree, the
protocol's system prompt, a fixed set of tools, turn and budget limits, a JSON schema for the
declaration) and turning the session's result message into an AgentResult with tokens and cost.
It never raises for a bad session: a missing, malformed or out-of-range declaration, an error
result or a crashed CLI is a failed attempt (AgentResult.error). Only a missing Claude Code CLI,
which no attempt can fix, raises a LadderError.

It does not commit, run checks or read the journal; the supervisor does. The agent's API key is
the CLI's business (its environment); nothing here writes it into the prompt or the worktree. Without an
injected transport, the CLI is started through ladder.agents.launch: a scrubbed environment (no
GITHUB_TOKEN, no cloud keys, no LADDER_JOURNAL_KEY), a private HOME and, where bubblewrap works, a
sandbox in which the worktree is the only thing it can write. Claude Code keeps its own system prompt
(the `claude_code` preset); ladder's protocol prompt is appended to it.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import json
import re
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import anyio
from claude_agent_sdk import (
    AssistantMessage,
    ClaudeAgentOptions,
    ClaudeSDKError,
    CLINotFoundError,
    HookMatcher,
    ResultMessage,
    TextBlock,
    Transport,
    query,
)
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from ladder._util.errors import LadderError
from ladder.agents import AgentResult, AttemptContext
from ladder.agents.prompts import PROTECTED_PATHS, build_attempt_prompt, build_system_prompt
from ladder.checks.results import LEVELS, Level

AGENT_TOOLS: tuple[str, ...] = ("Read", "Edit", "Write", "Glob", "Grep", "Bash")
# Defaults for a session when the caller gives none. The study spent $2-$23 of agent tokens per
# whole project; one attempt is one change, so a few dollars and a few dozen turns bound a runaway.
DEFAULT_MAX_TURNS = 40
DEFAULT_MAX_BUDGET_USD = 5.0
# Tools that write a file named in their input; the PreToolUse hook refuses protected paths.
_WRITING_TOOLS = {"Edit": "file_path", "Write": "file_path", "MultiEdit": "file_path", "NotebookEdit": "notebook_path"}

DECLARATION_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "declared_level": {"type": "string", "enum": list(LEVELS), "description": "the level this change reaches"},
        "summary": {"type": "string", "minLength": 1, "description": "what changed and why, one or two sentences"},
        "rationale": {"type": "string", "minLength": 1, "description": "evidence for the level; what was not verified"},
    },
    "required": ["declared_level", "summary", "rationale"],
    "additionalProperties": False,
}

TransportArg = Transport | Callable[[ClaudeAgentOptions], Transport] | None


class Declaration(BaseModel):
    """The agent's structured answer, validated again here: the schema is a request, not a promise."""

    model_config = ConfigDict(extra="ignore")

    declared_level: Level
    summary: str = Field(min_length=1)
    rationale: str = Field(min_length=1)


def _is_protected(path_text: str, worktree: Path) -> bool:
    path = Path(path_text)
    path = (path if path.is_absolute() else worktree / path).resolve()
    root = worktree.resolve()
    try:
        rel = path.relative_to(root).as_posix()
    except ValueError:
        return False  # outside the worktree: not ours to guard (the CLI's own sandbox rules apply)
    return any(rel == p.rstrip("/") or (p.endswith("/") and rel.startswith(p)) for p in PROTECTED_PATHS)


def protected_paths_hook(worktree: Path) -> Callable[..., Any]:
    """A PreToolUse hook that denies file-writing tools aimed at baselines/, journals/, protocols/ or
    ladder.toml. Defence in depth only: Bash can still write anywhere, so the supervisor's check after
    the attempt stays the rule that counts."""

    async def hook(input_data: dict[str, Any], tool_use_id: str | None, context: Any) -> dict[str, Any]:
        key = _WRITING_TOOLS.get(str(input_data.get("tool_name")))
        target = (input_data.get("tool_input") or {}).get(key) if key else None
        if isinstance(target, str) and _is_protected(target, worktree):
            return {
                "hookSpecificOutput": {
                    "hookEventName": "PreToolUse",
                    "permissionDecision": "deny",
                    "permissionDecisionReason": f"{target} is protected: {', '.join(PROTECTED_PATHS)} belong to ladder",
                }
            }
        return {}

    return hook


def _usage_tokens(result: ResultMessage) -> tuple[int | None, int | None]:
    """(input, output) tokens of the whole session. modelUsage covers every model call the CLI made
    (side calls such as titles included) and is what total_cost_usd is computed from, so it is
    preferred; `usage` covers the main loop only. Cache reads and writes count as input."""
    if result.model_usage:
        inp = out = 0
        for per_model in result.model_usage.values():
            u: dict[str, Any] = dict(per_model)  # type: ignore[arg-type]
            inp += int(u.get("inputTokens", 0)) + int(u.get("cacheReadInputTokens", 0))
            inp += int(u.get("cacheCreationInputTokens", 0))
            out += int(u.get("outputTokens", 0))
        return inp, out
    if result.usage:
        u = result.usage
        inp = sum(int(u.get(k) or 0) for k in ("input_tokens", "cache_read_input_tokens", "cache_creation_input_tokens"))
        return inp, int(u.get("output_tokens") or 0)
    return None, None


def _payload(result: ResultMessage) -> Any:
    if result.structured_output is not None:
        return result.structured_output
    # Without structured output, accept a JSON object as the final text (optionally fenced).
    text = (result.result or "").strip()
    fenced = re.search(r"```(?:json)?\s*(\{.*\})\s*```", text, re.S)
    try:
        return json.loads(fenced.group(1) if fenced else text)
    except (json.JSONDecodeError, TypeError):
        return None


def result_to_agent_result(result: ResultMessage | None, last_text: str = "") -> AgentResult:
    """The AgentResult for a session's result message; error set when no valid declaration came back."""
    if result is None:
        return AgentResult(error="the Claude Code session ended without a result message", summary=last_text)
    inp, out = _usage_tokens(result)
    base = {"input_tokens": inp, "output_tokens": out, "cost_usd": result.total_cost_usd, "turns": result.num_turns}
    if result.is_error:
        why = "; ".join(result.errors or []) or (result.result or "").strip() or result.subtype
        return AgentResult(error=f"Claude Code stopped with {result.subtype}: {why}", summary=last_text, **base)
    payload = _payload(result)
    if not isinstance(payload, dict):
        return AgentResult(
            error="no declaration: the session's result holds no {declared_level, summary, rationale} object",
            summary=last_text,
            **base,
        )
    try:
        decl = Declaration.model_validate(payload)
    except ValidationError as e:
        problems = "; ".join(f"{'.'.join(map(str, err['loc'])) or 'declaration'}: {err['msg']}" for err in e.errors())
        return AgentResult(
            error=f"invalid declaration {json.dumps(payload)[:300]}: {problems} (levels are {', '.join(LEVELS)})",
            summary=str(payload.get("summary") or last_text),
            **base,
        )
    return AgentResult(summary=decl.summary, declared_level=decl.declared_level, rationale=decl.rationale, **base)


def _bundled_cli() -> Path:
    import claude_agent_sdk

    path = Path(claude_agent_sdk.__file__).parent / "_bundled" / "claude"
    if not path.exists():
        raise LadderError("the Claude Code CLI bundled with claude-agent-sdk was not found",
                          "pip install claude-agent-sdk (it bundles the CLI), or pass cli_path")
    return path


class ClaudeCodeAgent:
    """Claude Code, one session per attempt. `transport` is the SDK's injection point (a Transport,
    or a factory given the session's options); without it the SDK starts the Claude Code CLI."""

    name = "claude-code"

    def __init__(
        self,
        *,
        model: str | None = None,
        max_turns: int = DEFAULT_MAX_TURNS,
        max_budget_usd: float = DEFAULT_MAX_BUDGET_USD,
        transport: TransportArg = None,
        env: dict[str, str] | None = None,
        cli_path: str | Path | None = None,
        sandbox: str = "auto",
        session_minutes: float | None = None,
    ) -> None:
        self.model = model
        self.max_turns = max_turns
        self.max_budget_usd = max_budget_usd
        self.transport = transport
        self.env = dict(env or {})
        self.cli_path = cli_path
        self.sandbox = sandbox
        self.session_minutes = session_minutes

    def launcher(self, ctx: AttemptContext) -> Path:
        """The `cli_path` the SDK starts: the real CLI under ladder.agents.launch (scrubbed env, sandbox)."""
        import tempfile

        from ladder.agents.launch import agent_config, write_launcher

        session = Path(tempfile.mkdtemp(prefix=f"ladder-agent-{ctx.attempt}-"))
        return write_launcher(session, agent_config(ctx, str(self.cli_path or _bundled_cli()), self.sandbox, session))

    def options(self, ctx: AttemptContext) -> ClaudeAgentOptions:
        """The session's options. Note the SDK applies CLI flags only when it starts the CLI itself."""
        worktree = Path(ctx.worktree)
        return ClaudeAgentOptions(
            cwd=worktree,
            # Claude Code's own system prompt (its tools, its safety), with the protocol's appended
            system_prompt={"type": "preset", "preset": "claude_code",
                           "append": ctx.protocol_prompt or build_system_prompt(ctx)},
            tools=list(AGENT_TOOLS),  # the only tools that exist in the session ...
            allowed_tools=list(AGENT_TOOLS),  # ... and all of them run without asking
            permission_mode="dontAsk",  # nobody is there to answer a prompt: deny what is not allowed
            setting_sources=[],  # the port is not trusted: its .claude/settings could run hooks
            hooks={"PreToolUse": [HookMatcher(matcher="|".join(_WRITING_TOOLS), hooks=[protected_paths_hook(worktree)],
                                              on_failure="block")]},
            max_turns=self.max_turns,
            max_budget_usd=self.max_budget_usd,
            model=self.model,
            output_format={"type": "json_schema", "schema": DECLARATION_SCHEMA},
            env=self.env,
            cli_path=self.cli_path if self.transport is not None else self.launcher(ctx),
        )

    async def amake_change(self, ctx: AttemptContext) -> AgentResult:
        minutes = self.session_minutes or ctx.session_minutes
        if minutes:
            with anyio.move_on_after(minutes * 60) as scope:
                result = await self._session(ctx)
            if scope.cancelled_caught:
                return AgentResult(error=f"the Claude Code session ran past its wall-clock limit ({minutes:g} min)")
            return result
        return await self._session(ctx)

    async def _session(self, ctx: AttemptContext) -> AgentResult:
        options = self.options(ctx)
        # The launcher's session folder (its config, script and private HOME) goes with the session.
        session = None if self.transport is not None else Path(options.cli_path).parent
        try:
            return await self._query(ctx, options)
        finally:
            if session is not None:
                shutil.rmtree(session, ignore_errors=True)

    async def _query(self, ctx: AttemptContext, options: ClaudeAgentOptions) -> AgentResult:
        transport = self.transport(options) if callable(self.transport) and not isinstance(
            self.transport, Transport) else self.transport
        result: ResultMessage | None = None
        last_text = ""
        try:
            async for message in query(prompt=build_attempt_prompt(ctx), options=options, transport=transport):
                if isinstance(message, AssistantMessage):
                    texts = [b.text for b in message.content if isinstance(b, TextBlock) and b.text.strip()]
                    last_text = texts[-1].strip() if texts else last_text
                elif isinstance(message, ResultMessage):
                    result = message
        except CLINotFoundError as e:
            raise LadderError(f"the Claude Code CLI was not found: {e}",
                              "pip install claude-agent-sdk (it bundles the CLI), or pass cli_path") from e
        except ClaudeSDKError as e:
            # An error result is followed by the CLI's non-zero exit; the result already says why.
            if result is None or not result.is_error:
                failed = result_to_agent_result(result, last_text)
                return failed.model_copy(update={"error": f"the Claude Code session failed: {e}"})
        return result_to_agent_result(result, last_text)

    def make_change(self, ctx: AttemptContext) -> AgentResult:
        try:
            asyncio.get_running_loop()
        except RuntimeError:
            return anyio.run(self.amake_change, ctx)
        # Called from inside an event loop (an async graph node): run the session on its own loop.
        with concurrent.futures.ThreadPoolExecutor(max_workers=1) as pool:
            return pool.submit(anyio.run, self.amake_change, ctx).result()
