"""The claude-code agent against a replayed Claude Code CLI, through the SDK's `transport=` injection point.

ReplayCLI speaks the CLI's side of the SDK's stream-json protocol: it answers `initialize`, reads
the prompt, then plays a session. The frames are shaped after a real session recorded from the
Claude Code CLI 2.1.332 bundled with claude-agent-sdk 0.2.189 (run against a local stand-in for the
Messages API): session_state_changed, system/init, an assistant Edit tool_use, the CLI's PreToolUse
hook_callback request to the SDK, the tool result, the StructuredOutput tool call, then the result
with structured_output, usage, modelUsage and total_cost_usd. The replay really applies the Edit to
a file in a temporary git worktree, and only when the SDK-side hook allowed it, as the CLI would.
"""

from __future__ import annotations

import json
import re
import subprocess
import tempfile
import threading
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import anyio
import pytest
from claude_agent_sdk import ClaudeAgentOptions, ProcessError, Transport

from ladder.agents import AttemptContext
from ladder.agents.claude_code import AGENT_TOOLS, DECLARATION_SCHEMA, ClaudeCodeAgent

SESSION = "7f97292e-47b3-4a69-9655-10a78eadc5f4"
MODEL = "claude-opus-5-5"
INIT_RESPONSE = {  # the CLI's answer to `initialize`, trimmed of its long command and model lists
    "commands": [],
    "agents": [{"name": "general-purpose", "description": "General-purpose agent"}],
    "output_style": "default",
    "available_output_styles": ["default"],
    "models": [{"value": "default", "resolvedModel": MODEL, "displayName": "Default (recommended)"}],
    "account": {"tokenSource": "none", "apiKeySource": "ANTHROPIC_API_KEY", "apiProvider": "firstParty"},
    "pid": 14526,
    "claude_code_version": "2.1.332",
    "current_permission_mode": "dontAsk",
    "hook_on_failure_supported": True,
    "session_state": "idle",
}
ORIGINAL = "import torch\n\ndevice = 'cuda'\nmodel = torch.nn.Linear(4, 2).to(device)\n"
EDIT = {"replace_all": False, "old_string": "device = 'cuda'", "new_string": "device = xm.xla_device()"}


def _state(state: str) -> dict[str, Any]:
    return {"type": "system", "subtype": "session_state_changed", "state": state, "sdk_host_only": True,
            "uuid": str(uuid.uuid4()), "session_id": SESSION}


def _init(cwd: Path) -> dict[str, Any]:
    return {"type": "system", "subtype": "init", "cwd": str(cwd), "session_id": SESSION,
            "tools": [*AGENT_TOOLS, "StructuredOutput"], "mcp_servers": [], "model": MODEL,
            "permissionMode": "dontAsk", "slash_commands": [], "apiKeySource": "ANTHROPIC_API_KEY",
            "claude_code_version": "2.1.332", "output_style": "default", "agents": ["general-purpose"],
            "skills": [], "plugins": [], "uuid": str(uuid.uuid4()), "sandbox_enabled": False}


def _assistant(block: dict[str, Any], output_tokens: int) -> dict[str, Any]:
    return {"type": "assistant",
            "message": {"id": f"msg_{uuid.uuid4().hex[:20]}", "type": "message", "role": "assistant", "model": MODEL,
                        "content": [block], "stop_reason": None, "stop_sequence": None,
                        "usage": {"input_tokens": 1200, "cache_creation_input_tokens": 0,
                                  "cache_read_input_tokens": 800, "output_tokens": output_tokens},
                        "context_management": None},
            "parent_tool_use_id": None, "session_id": SESSION, "uuid": str(uuid.uuid4())}


def _tool_result(tool_use_id: str, content: str, tool_use_result: Any, is_error: bool = False) -> dict[str, Any]:
    block: dict[str, Any] = {"tool_use_id": tool_use_id, "type": "tool_result", "content": content}
    if is_error:
        block["is_error"] = True
    return {"type": "user", "message": {"role": "user", "content": [block]}, "parent_tool_use_id": None,
            "session_id": SESSION, "uuid": str(uuid.uuid4()), "tool_use_result": tool_use_result}


def _result(structured: Any, *, subtype: str = "success", is_error: bool = False, errors: list[str] | None = None,
            result_text: str | None = None) -> dict[str, Any]:
    frame = {
        "type": "result", "subtype": subtype, "is_error": is_error, "duration_ms": 228, "duration_api_ms": 112,
        "num_turns": 3, "stop_reason": "tool_use", "session_id": SESSION, "total_cost_usd": 0.01782,
        "usage": {"input_tokens": 2400, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 1600,
                  "output_tokens": 114, "service_tier": "standard"},
        "modelUsage": {MODEL: {"inputTokens": 3600, "outputTokens": 171, "cacheReadInputTokens": 1600,
                               "cacheCreationInputTokens": 0, "webSearchRequests": 0, "costUSD": 0.01782,
                               "contextWindow": 1000000, "maxOutputTokens": 128000}},
        "permission_denials": [], "terminal_reason": "completed", "uuid": str(uuid.uuid4()),
        "result": result_text if result_text is not None else (json.dumps(structured) if structured else ""),
    }
    if structured is not None:
        frame["structured_output"] = structured
    if errors is not None:
        frame["errors"] = errors
    return frame


class ReplayCLI(Transport):
    """The CLI's side of the stream-json protocol, playing one scripted session."""

    def __init__(self, script: Callable[["ReplayCLI"], AsyncIterator[dict[str, Any]]], exit_code: int = 0) -> None:
        self.script = script
        self.exit_code = exit_code  # the real CLI exits 1 after an error result
        self.written: list[dict[str, Any]] = []
        self.hooks: dict[str, list[dict[str, Any]]] = {}
        self.prompt: str | None = None
        self.hook_answers: list[dict[str, Any]] = []
        self._inbox, self._outbox = anyio.create_memory_object_stream[dict[str, Any]](100)
        self._answers: dict[str, dict[str, Any]] = {}
        self._answered: dict[str, anyio.Event] = {}
        self._prompted = anyio.Event()
        self._stdin_closed = anyio.Event()
        self._ready = False

    async def connect(self) -> None:
        self._ready = True

    def is_ready(self) -> bool:
        return self._ready

    async def write(self, data: str) -> None:
        frame = json.loads(data)
        self.written.append(frame)
        if frame["type"] == "control_request" and frame["request"]["subtype"] == "initialize":
            self.hooks = frame["request"].get("hooks") or {}
            await self._inbox.send({"type": "control_response", "response": {
                "subtype": "success", "request_id": frame["request_id"], "response": INIT_RESPONSE}})
        elif frame["type"] == "control_response":
            rid = frame["response"]["request_id"]
            self._answers[rid] = frame["response"]
            self._answered[rid].set()
        elif frame["type"] == "user":
            self.prompt = frame["message"]["content"]
            self._prompted.set()

    async def end_input(self) -> None:
        self._stdin_closed.set()

    async def close(self) -> None:
        self._ready = False

    def pre_tool_use(self, tool_name: str, tool_input: dict[str, Any], tool_use_id: str, cwd: Path) -> list[dict]:
        """The hook_callback requests the CLI sends before running a tool (one per matching callback)."""
        requests = []
        for matcher in self.hooks.get("PreToolUse", []):
            if matcher["matcher"] and not re.fullmatch(matcher["matcher"], tool_name):
                continue
            for callback_id in matcher["hookCallbackIds"]:
                rid = f"hook-{uuid.uuid4().hex[:8]}"
                self._answered[rid] = anyio.Event()
                requests.append({"type": "control_request", "request_id": rid, "request": {
                    "subtype": "hook_callback", "callback_id": callback_id, "tool_use_id": tool_use_id,
                    "input": {"session_id": SESSION, "transcript_path": "/dev/null", "cwd": str(cwd),
                              "permission_mode": "dontAsk", "hook_event_name": "PreToolUse",
                              "tool_name": tool_name, "tool_input": tool_input, "tool_use_id": tool_use_id}}})
        return requests

    async def answer(self, request: dict[str, Any]) -> dict[str, Any]:
        rid = request["request_id"]
        with anyio.fail_after(10):
            await self._answered[rid].wait()
        self.hook_answers.append(self._answers[rid])
        return self._answers[rid]

    async def read_messages(self) -> AsyncIterator[dict[str, Any]]:
        yield await self._outbox.receive()  # the answer to `initialize`, which comes first
        await self._prompted.wait()
        async for frame in self.script(self):
            yield frame
        await self._stdin_closed.wait()  # the CLI exits once the SDK closes its stdin
        if self.exit_code:
            raise ProcessError("Command failed with exit code 1", exit_code=self.exit_code, stderr="")


async def _hooked_tool(cli: ReplayCLI, cwd: Path, tool_use_id: str, name: str, tool_input: dict[str, Any]):
    """Ask the SDK's PreToolUse hooks, as the CLI does; yields the requests, returns via cli.hook_answers."""
    for request in cli.pre_tool_use(name, tool_input, tool_use_id, cwd):
        yield request
        await cli.answer(request)


def edit_session(target: str, declaration: Any, **result_kw: Any) -> Callable[[ReplayCLI], AsyncIterator[dict]]:
    """A session that edits `target` (relative to cwd) and ends with `declaration` as structured output."""

    async def script(cli: ReplayCLI) -> AsyncIterator[dict[str, Any]]:
        cwd = Path(cli.cwd)
        path = cwd / target
        tool_input = {**EDIT, "file_path": str(path)} if target == "train.py" else {
            "replace_all": False, "file_path": str(path), "old_string": "protocol", "new_string": "lax"}
        yield _state("running")
        yield _init(cwd)
        yield _assistant({"type": "tool_use", "id": "toolu_01EDIT", "name": "Edit", "input": tool_input}, 40)
        async for request in _hooked_tool(cli, cwd, "toolu_01EDIT", "Edit", tool_input):
            yield request
        decisions = [a["response"].get("hookSpecificOutput", {}) for a in cli.hook_answers]
        denied = [d for d in decisions if d.get("permissionDecision") == "deny"]
        if denied:
            reason = denied[0].get("permissionDecisionReason", "")
            text = f"PreToolUse:Edit hook error: {reason}"  # what CLI 2.1.332 sends for a hook's deny
            yield _tool_result("toolu_01EDIT", text, f"Error: {text}", True)
        else:
            original = path.read_text()
            path.write_text(original.replace(tool_input["old_string"], tool_input["new_string"], 1))
            yield _tool_result("toolu_01EDIT", f"The file {path} has been updated successfully.", {
                "filePath": str(path), "oldString": tool_input["old_string"], "newString": tool_input["new_string"],
                "originalFile": original, "userModified": False, "replaceAll": False})
        if declaration is not None:
            yield _assistant({"type": "tool_use", "id": "toolu_02SO", "name": "StructuredOutput",
                              "input": declaration}, 74)
            yield _tool_result("toolu_02SO", "Structured output provided successfully",
                               "Structured output provided successfully")
        else:
            yield _assistant({"type": "text", "text": "I switched the device to XLA; it should work now."}, 74)
        yield _result(declaration, **result_kw)
        yield _state("idle")

    return script


@pytest.fixture
def worktree(tmp_path: Path) -> Path:
    """A real git repository with the port, and a worktree on branch ladder/attempt-1."""
    repo = tmp_path / "port"
    repo.mkdir()
    (repo / "train.py").write_text(ORIGINAL)
    (repo / "ladder.toml").write_text('name = "demo"\nprotocol = "ncsu"\n')
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@t", "-C", str(repo)]
    subprocess.run([*git, "init", "-q", "-b", "main"], check=True)
    subprocess.run([*git, "add", "."], check=True)
    subprocess.run([*git, "commit", "-qm", "original"], check=True)
    wt = tmp_path / "attempt-1"
    subprocess.run([*git, "worktree", "add", "-q", "-b", "ladder/attempt-1", str(wt)], check=True)
    return wt


def _ctx(worktree: Path) -> AttemptContext:
    return AttemptContext(
        migration="demo", attempt=1, parent=0, worktree=worktree, target_platform="xla", reference_platform="cpu",
        spec_text='name = "demo"\n', journal_summary="attempt 0: declared -, achieved none (crash)",
        last_notes=[{"cause": "device = 'cuda' hard-coded", "diagnosis": "no CUDA on the target",
                     "fix": "use the XLA device", "silent": False}],
        short_command="python train.py --steps 200",
    )


def _agent(script: Callable, seen: list, exit_code: int = 0) -> tuple[ClaudeCodeAgent, list[ReplayCLI]]:
    replays: list[ReplayCLI] = []

    def factory(options: ClaudeAgentOptions) -> ReplayCLI:
        seen.append(options)
        cli = ReplayCLI(script, exit_code)
        cli.cwd = str(options.cwd)  # the CLI runs in the session's cwd
        replays.append(cli)
        return cli

    return ClaudeCodeAgent(transport=factory, max_turns=7, max_budget_usd=1.5), replays


def _git_diff(worktree: Path) -> str:
    return subprocess.run(["git", "-C", str(worktree), "diff"], capture_output=True, text=True, check=True).stdout


def test_session_edits_the_worktree_and_declares(worktree: Path) -> None:
    declaration = {"declared_level": "L1", "summary": "Use the XLA device instead of CUDA.",
                   "rationale": "The crash was the hard-coded device; recompilation not checked yet."}
    seen: list[ClaudeAgentOptions] = []
    agent, replays = _agent(edit_session("train.py", declaration), seen)

    result = agent.make_change(_ctx(worktree))

    assert result.error is None
    assert (result.declared_level, result.summary, result.rationale) == ("L1", declaration["summary"],
                                                                        declaration["rationale"])
    # modelUsage covers every call the session made: input + cache reads, and the cost beside it.
    assert (result.input_tokens, result.output_tokens, result.cost_usd, result.turns) == (5200, 171, 0.01782, 3)
    assert "device = xm.xla_device()" in (worktree / "train.py").read_text()
    assert "-device = 'cuda'" in _git_diff(worktree) and "+device = xm.xla_device()" in _git_diff(worktree)
    # What the session was started with.
    options = seen[0]
    assert Path(options.cwd) == worktree and options.output_format == {"type": "json_schema",
                                                                      "schema": DECLARATION_SCHEMA}
    assert options.allowed_tools == list(AGENT_TOOLS) and options.permission_mode == "dontAsk"
    assert (options.max_turns, options.max_budget_usd) == (7, 1.5)
    # Claude Code's own system prompt, with the protocol's appended (never replaced)
    assert options.system_prompt["type"] == "preset" and options.system_prompt["preset"] == "claude_code"
    appended = options.system_prompt["append"]
    assert "declare" in appended.lower() and "baselines/" in appended
    assert "Attempt 1" in replays[0].prompt and "device = 'cuda' hard-coded" in replays[0].prompt
    # The hook was registered with the CLI, asked about the Edit, and had no objection.
    assert replays[0].hooks["PreToolUse"][0]["matcher"] == "Edit|Write|MultiEdit|NotebookEdit"
    assert [a["response"] for a in replays[0].hook_answers] == [{}]


@pytest.mark.parametrize("declaration", [
    {"declared_level": "L7", "summary": "Use the XLA device.", "rationale": "it runs"},
    {"summary": "Use the XLA device.", "rationale": "no level given"},
    {"declared_level": "L2", "summary": "", "rationale": "empty summary"},
])
def test_malformed_declaration_is_a_failed_attempt(worktree: Path, declaration: dict) -> None:
    agent, _ = _agent(edit_session("train.py", declaration), [])

    result = agent.make_change(_ctx(worktree))

    assert result.declared_level is None
    assert result.error and "invalid declaration" in result.error
    assert result.cost_usd == 0.01782 and result.input_tokens == 5200  # the spend is still recorded


def test_missing_declaration_is_a_failed_attempt(worktree: Path) -> None:
    agent, _ = _agent(edit_session("train.py", None, result_text="I switched the device to XLA."), [])

    result = agent.make_change(_ctx(worktree))

    assert result.declared_level is None and result.error and result.error.startswith("no declaration")
    assert result.summary == "I switched the device to XLA; it should work now."


def test_error_result_and_nonzero_exit_are_a_failed_attempt(worktree: Path) -> None:
    declaration = {"declared_level": "L2", "summary": "s", "rationale": "r"}
    script = edit_session("train.py", declaration, subtype="error_max_budget_usd", is_error=True,
                          errors=["Reached maximum budget ($1.5)"])
    agent, _ = _agent(script, [], exit_code=1)

    result = agent.make_change(_ctx(worktree))

    assert result.declared_level is None
    assert result.error == "Claude Code stopped with error_max_budget_usd: Reached maximum budget ($1.5)"
    assert result.cost_usd == 0.01782


def test_hook_denies_edits_to_protected_paths(worktree: Path) -> None:
    before = (worktree / "ladder.toml").read_text()
    declaration = {"declared_level": "L0", "summary": "tried to relax the protocol", "rationale": "r"}
    agent, replays = _agent(edit_session("ladder.toml", declaration), [])

    result = agent.make_change(_ctx(worktree))

    assert (worktree / "ladder.toml").read_text() == before
    answer = replays[0].hook_answers[0]["response"]["hookSpecificOutput"]
    assert answer["permissionDecision"] == "deny" and "protected" in answer["permissionDecisionReason"]
    assert result.declared_level == "L0"  # the denial is the tool's failure, not the declaration's


def test_make_change_works_inside_a_running_event_loop(worktree: Path) -> None:
    declaration = {"declared_level": "L0", "summary": "s", "rationale": "r"}
    agent, _ = _agent(edit_session("train.py", declaration), [])

    async def node() -> str | None:
        return agent.make_change(_ctx(worktree)).declared_level

    assert anyio.run(node) == "L0"


# --- The real Claude Code CLI, against a local stand-in for the Messages API --------------------------

BUNDLED_CLI = Path(__import__("claude_agent_sdk").__file__).parent / "_bundled" / "claude"


def _sse(event: str, data: dict[str, Any]) -> bytes:
    return f"event: {event}\ndata: {json.dumps(data)}\n\n".encode()


def _messages_api(edit_input: dict[str, Any], declaration: dict[str, Any]) -> ThreadingHTTPServer:
    """Streams one Edit tool call, then the StructuredOutput call, then a closing text; side calls get text."""

    class Handler(BaseHTTPRequestHandler):
        def log_message(self, *args: Any) -> None:
            pass

        def do_POST(self) -> None:
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length") or 0)) or b"{}")
            tools = [t.get("name") for t in body.get("tools", [])]
            seen = [b.get("tool_use_id") for m in body.get("messages", []) if isinstance(m.get("content"), list)
                    for b in m["content"] if isinstance(b, dict) and b.get("type") == "tool_result"]
            if "Edit" in tools and not seen:
                block, stop = {"type": "tool_use", "id": "toolu_01EDIT", "name": "Edit", "input": edit_input}, "tool_use"
            elif "StructuredOutput" in tools and seen == ["toolu_01EDIT"]:
                block = {"type": "tool_use", "id": "toolu_02SO", "name": "StructuredOutput", "input": declaration}
                stop = "tool_use"
            else:
                block, stop = {"type": "text", "text": "Done."}, "end_turn"
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            start = {**block, "input": {}} if block["type"] == "tool_use" else {"type": "text", "text": ""}
            delta = ({"type": "input_json_delta", "partial_json": json.dumps(block["input"])}
                     if block["type"] == "tool_use" else {"type": "text_delta", "text": block["text"]})
            usage = {"input_tokens": 1200, "cache_creation_input_tokens": 0, "cache_read_input_tokens": 0,
                     "output_tokens": 1}
            for event, data in [
                ("message_start", {"type": "message_start", "message": {
                    "id": "msg_01", "type": "message", "role": "assistant", "model": body.get("model"), "content": [],
                    "stop_reason": None, "stop_sequence": None, "usage": usage}}),
                ("content_block_start", {"type": "content_block_start", "index": 0, "content_block": start}),
                ("content_block_delta", {"type": "content_block_delta", "index": 0, "delta": delta}),
                ("content_block_stop", {"type": "content_block_stop", "index": 0}),
                ("message_delta", {"type": "message_delta", "delta": {"stop_reason": stop, "stop_sequence": None},
                                   "usage": {"output_tokens": 57}}),
                ("message_stop", {"type": "message_stop"}),
            ]:
                self.wfile.write(_sse(event, data))
            self.close_connection = True

        def do_GET(self) -> None:
            self.send_response(404)
            self.send_header("Content-Length", "0")
            self.end_headers()

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


@pytest.mark.slow
@pytest.mark.skipif(not BUNDLED_CLI.exists(), reason="claude-agent-sdk without its bundled Claude Code CLI")
@pytest.mark.parametrize("target", ["train.py", "ladder.toml"])
def test_real_cli_session_with_our_options(worktree: Path, tmp_path: Path, target: str, monkeypatch) -> None:
    """The options really drive the CLI: tools, dontAsk, the PreToolUse hook, the JSON schema; the launcher's
    session folder goes with the session."""
    sessions = tmp_path / "sessions"
    sessions.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(sessions))
    path = worktree / target
    before = path.read_text()
    edit = {**EDIT, "file_path": str(path)} if target == "train.py" else {
        "replace_all": False, "file_path": str(path), "old_string": "ncsu", "new_string": "lax"}
    declaration = {"declared_level": "L1", "summary": "Use the XLA device.", "rationale": "the crash was the device"}
    server = _messages_api(edit, declaration)
    home = tmp_path / "home"
    home.mkdir()
    agent = ClaudeCodeAgent(max_turns=6, max_budget_usd=1.0, env={
        "HOME": str(home), "ANTHROPIC_API_KEY": "sk-ant-offline-test",
        "ANTHROPIC_BASE_URL": f"http://127.0.0.1:{server.server_address[1]}", "CLAUDE_CODE_MAX_RETRIES": "0"})
    try:
        result = agent.make_change(_ctx(worktree))
    finally:
        server.shutdown()
        server.server_close()

    assert result.error is None and result.declared_level == "L1"
    assert not [p for p in sessions.iterdir() if p.name.startswith("ladder-agent-")]
    assert result.input_tokens and result.output_tokens and result.cost_usd and result.cost_usd > 0
    if target == "train.py":
        assert "+device = xm.xla_device()" in _git_diff(worktree)
    else:
        assert path.read_text() == before  # the hook refused the edit inside the real CLI
