"""Start the Claude Code CLI for one attempt inside the agent's sandbox, with a scrubbed environment.

claude-agent-sdk starts its CLI with the whole parent environment merged in (GITHUB_TOKEN, cloud keys,
LADDER_JOURNAL_KEY...). ladder therefore hands the SDK a `cli_path` that is a small launcher script
(`write_launcher`): it runs `python -m ladder.agents.launch CONFIG -- ARGS`, which keeps only the variables
the CLI needs (`ALLOWED`), gives it a private HOME, and execs the real CLI under bubblewrap.

What the agent (the CLI and every command its Bash tool runs) can see in the sandbox: the system's
read-only directories, the environments the profiles run in (read-only, to run the code), the
repository's git directory (read-only: it may read history, not write it), a feedback directory with
its own runs' logs and the names and statuses of their checks (read-only), and its worktree, the only
place it can write (with /tmp and HOME, private and empty). It cannot see the workspace (ladder.toml,
baselines/, journals/, the hidden target) nor the user's home.

Must not: run anything but the CLI it was given.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import sys
from pathlib import Path

# What the CLI needs: its credentials and settings, locale, proxies without credentials, CA bundles.
ALLOWED = re.compile(r"^(ANTHROPIC_(API_KEY|AUTH_TOKEN|BASE_URL|MODEL|SMALL_FAST_MODEL|CUSTOM_HEADERS|BETAS)"
                     r"|CLAUDE_CODE_[A-Z0-9_]+|CLAUDE_AGENT_SDK_[A-Z0-9_]+|CLAUDE_CONFIG_DIR|DISABLE_[A-Z0-9_]+"
                     r"|MAX_THINKING_TOKENS|PATH|LANG|LANGUAGE|LC_[A-Z]+|TERM|TZ|PWD"
                     r"|NODE_EXTRA_CA_CERTS|SSL_CERT_FILE|SSL_CERT_DIR|REQUESTS_CA_BUNDLE"
                     r"|HTTPS?_PROXY|NO_PROXY|https?_proxy|no_proxy)$")
URL_CREDENTIALS = re.compile(r"://[^/\s:@]+:[^/\s@]+@")


def agent_env(parent: dict[str, str], home: str) -> dict[str, str]:
    """The variables the CLI keeps: ALLOWED names, proxies only without credentials; HOME private."""
    env = {k: v for k, v in parent.items() if ALLOWED.match(k) and not URL_CREDENTIALS.search(v or "")}
    env["HOME"] = home
    return env


def write_launcher(directory: Path, config: dict) -> Path:
    """A launcher script for `cli_path`, with its config beside it."""
    directory.mkdir(parents=True, exist_ok=True)
    cfg = directory / "launch.json"
    cfg.write_text(json.dumps(config))
    script = directory / "claude-sandboxed"
    script.write_text(f"#!/bin/sh\nexec {shlex.quote(sys.executable)} -m ladder.agents.launch "
                      f"{shlex.quote(str(cfg))} -- \"$@\"\n")
    script.chmod(0o700)
    return script


def sandboxed_command(config: dict, command: list[str]) -> tuple[list[str], dict[str, str]]:
    """(argv, env) that run a command the way the agent's CLI runs: scrubbed env, private HOME, sandbox."""
    env = agent_env(dict(os.environ), config["home"])
    cmd = list(command)
    if config.get("sandbox") == "bwrap":
        from ladder.runs.runner.sandbox import Sandbox, bwrap_argv

        box = Sandbox("bwrap", tuple(Path(p) for p in config.get("read_only", [])),
                      tuple(Path(p) for p in config.get("writable", [])))
        cmd = bwrap_argv(box, Path(config["cwd"]), env) + cmd
    return cmd, env


def agent_config(ctx, cli: str, sandbox_choice: str, session: Path) -> dict:  # ctx: AttemptContext
    """The sandbox of one agent session: its worktree writable; environments, git history, feedback read-only."""
    from ladder.runs.runner.sandbox import PRIVATE_HOME, resolve

    kind, _ = resolve(sandbox_choice)
    read_only = [Path(cli).parent, *ctx.read_only] + ([ctx.feedback_dir] if ctx.feedback_dir else [])
    return {"cli": cli, "sandbox": kind, "cwd": str(ctx.worktree), "read_only": [str(p) for p in read_only],
            # under bubblewrap HOME is the sandbox's own empty tmpfs: no folder on the host to leave behind
            "writable": [str(ctx.worktree)], "home": PRIVATE_HOME if kind == "bwrap" else str(session / "home")}


def main(argv: list[str]) -> None:
    cfg = json.loads(Path(argv[0]).read_text())
    args = argv[2:] if len(argv) > 1 and argv[1] == "--" else argv[1:]
    cmd, env = sandboxed_command(cfg, [cfg["cli"], *args])
    os.execvpe(cmd[0], cmd, env)


if __name__ == "__main__":
    main(sys.argv[1:])
