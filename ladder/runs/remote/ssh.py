"""The ssh transport: the system OpenSSH client, so a host is reached exactly as the user's own `ssh` does.

`ssh` reads ~/.ssh/config (or the profile's `config`): aliases, ProxyJump, IdentityFile, certificates,
the agent and known_hosts all work as they do on the command line, which no library reproduces whole.
One master connection per host is shared by every call (ControlMaster, in a private directory), so a run's
dozen calls pay one handshake. Files travel as gzipped tar streams over the same connection, unpacked by
the agent: the machine needs python3 and sshd, nothing else (no rsync).

The ssh client gets ladder's environment scrubbed of secrets (SSH_AUTH_SOCK excepted, which reaches no
remote): whatever `SendEnv` a user's config holds, no local secret leaves this machine through it.
Must not: interpret what the agent replies (that is `session`), or retry (the caller decides).
"""

from __future__ import annotations

import ctypes
import json
import os
import shlex
import signal
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ladder.migration.spec import SshTarget
from ladder.runs.runner.scrub import scrubbed_env

SSH_UNREACHABLE = 255  # ssh's own exit status: the connection failed or dropped


class TransportError(Exception):
    """The machine could not be reached, or the connection dropped (ssh exited 255)."""


class RemoteError(Exception):
    """The agent on the machine failed (it ran, and said why)."""


def _die_with_parent() -> None:
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    except OSError:
        pass


def control_dir() -> Path:
    d = Path(os.environ.get("LADDER_SSH_CONTROL_DIR", f"/tmp/ladder-ssh-{os.getuid()}"))
    d.mkdir(mode=0o700, parents=True, exist_ok=True)
    return d


@dataclass
class SshConnection:
    target: SshTarget
    keepalive_s: float = 5.0
    connect_timeout_s: float = 15.0

    @property
    def host(self) -> str:
        return self.target.host

    def argv(self, command: str) -> list[str]:
        t = self.target
        argv = ["ssh"]
        if t.config:
            argv += ["-F", os.path.expanduser(t.config)]
        opts = {"BatchMode": "yes", "ConnectTimeout": str(int(self.connect_timeout_s)),
                "ServerAliveInterval": str(int(self.keepalive_s)), "ServerAliveCountMax": "3",
                "ControlMaster": "auto", "ControlPath": str(control_dir() / "%C"), "ControlPersist": "120",
                "LogLevel": "ERROR"}
        if t.known_hosts:
            opts["UserKnownHostsFile"] = os.path.expanduser(t.known_hosts)
        if t.identity_file:
            opts["IdentityFile"] = os.path.expanduser(t.identity_file)
            opts["IdentitiesOnly"] = "yes"
        opts.update(t.options)
        for k, v in opts.items():
            argv += ["-o", f"{k}={v}"]
        if t.port:
            argv += ["-p", str(t.port)]
        if t.user:
            argv += ["-l", t.user]
        return argv + ["-T", t.host, "--", command]

    def _env(self) -> dict[str, str]:
        env, _ = scrubbed_env(dict(os.environ), ["SSH_AUTH_SOCK"])
        return env

    def run(self, command: str, stdin: bytes | None = None, timeout: float = 600.0) -> subprocess.CompletedProcess:
        try:
            p = subprocess.run(self.argv(command), input=stdin if stdin is not None else b"", capture_output=True,
                               timeout=timeout, env=self._env())
        except subprocess.TimeoutExpired as e:
            raise TransportError(f"ssh {self.host}: no answer within {timeout:.0f}s") from e
        if p.returncode == SSH_UNREACHABLE:
            raise TransportError(f"ssh {self.host}: {p.stderr.decode(errors='replace').strip()[-500:]}")
        return p

    def stream(self, command: str, stdin: bytes | None = None, pipe_stdin: bool = False) -> subprocess.Popen:
        """A long call whose stdout is read as it comes (dies with ladder: the parent-death signal). `stdin` is
        written and closed; `pipe_stdin` leaves the pipe to the caller."""
        piped = stdin is not None or pipe_stdin
        proc = subprocess.Popen(self.argv(command), stdin=subprocess.PIPE if piped else subprocess.DEVNULL,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=self._env(),
                                preexec_fn=_die_with_parent)
        if stdin is not None:
            assert proc.stdin is not None
            proc.stdin.write(stdin)
            proc.stdin.close()
        return proc

    def close(self) -> None:
        """End the shared master connection (the next call opens a new one)."""
        argv = self.argv("true")
        subprocess.run(argv[:-4] + ["-O", "exit", self.target.host], capture_output=True, env=self._env(),
                       timeout=30)


def json_reply(p: subprocess.CompletedProcess, what: str) -> dict[str, Any]:
    """The agent's JSON reply (its last stdout line), or RemoteError with its stderr."""
    lines = p.stdout.decode(errors="replace").strip().splitlines()
    if p.returncode != 0 or not lines:
        raise RemoteError(f"{what} failed (exit {p.returncode}): {p.stderr.decode(errors='replace').strip()[-1500:]}")
    try:
        return json.loads(lines[-1])
    except ValueError as e:
        raise RemoteError(f"{what}: unreadable reply {lines[-1][:300]!r}") from e


def shell(*args: str) -> str:
    """A remote command line; a leading `~/` stays outside the quotes so the remote shell expands it."""
    out = []
    for a in args:
        if a.startswith("~/"):
            out.append('"$HOME"/' + shlex.quote(a[2:]))
        else:
            out.append(shlex.quote(a))
    return " ".join(out)
