"""A real OpenSSH server for the ssh runner's tests: Debian's sshd on 127.0.0.1, a free port, generated keys,
its own known_hosts and client config. The "remote machine" is this one, but ladder reaches it only through
ssh: its working root is a directory of its own (standing in for the remote home), nothing is shared with
the local workspace but what ssh carries.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

SSHD = shutil.which("sshd") or "/usr/sbin/sshd"
FIXTURE = Path(__file__).resolve().parent / "fixtures" / "remote"


@dataclass
class SshServer:
    dir: Path
    port: int
    proc: subprocess.Popen
    alias: str = "ladder-test-host"

    @property
    def config(self) -> Path:
        return self.dir / "ssh_config"

    @property
    def remote_root(self) -> Path:
        return self.dir / "remote-home" / ".ladder"

    def profile_table(self, cache: str | None = None) -> str:
        """The `ssh = {...}` value of a profile that reaches this server through its alias."""
        extra = f', cache = "{cache}"' if cache else ""
        return (f'{{ host = "{self.alias}", config = "{self.config}", root = "{self.remote_root}", '
                f'python = "/usr/bin/python3"{extra} }}')

    def session_pids(self) -> list[int]:
        """The per-connection sshd processes (children of the listener), not the listener itself."""
        out = []
        for p in Path("/proc").iterdir():
            if not p.name.isdigit():
                continue
            try:
                stat = (p / "stat").read_text()
                comm = (p / "comm").read_text().strip()
            except OSError:
                continue
            ppid = int(stat[stat.rindex(")") + 2:].split()[1])
            if comm == "sshd" and ppid == self.proc.pid:
                out.append(int(p.name))
        return out

    def drop_connections(self) -> int:
        """Kill every ssh session this server holds (as a network drop would end them)."""
        pids = self.session_pids()
        for pid in pids:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        return len(pids)

    def stop(self) -> None:
        self.drop_connections()
        self.proc.terminate()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()


GIT_ID = {"GIT_AUTHOR_NAME": "ladder tests", "GIT_AUTHOR_EMAIL": "tests@ladder.invalid",
          "GIT_COMMITTER_NAME": "ladder tests", "GIT_COMMITTER_EMAIL": "tests@ladder.invalid"}


@pytest.fixture(scope="module")
def sshd(tmp_path_factory) -> SshServer:
    """A server for the module's tests (import this fixture into the test module); skipped where none starts."""
    server = start_sshd(tmp_path_factory.mktemp("sshd"))
    if isinstance(server, str):
        pytest.skip(f"sshd cannot start here: {server}")
    yield server
    server.stop()


@pytest.fixture()
def ssh_env(tmp_path_factory, monkeypatch) -> None:
    """A private directory for ssh's master connections, and a git identity for the supervisor's commits."""
    monkeypatch.setenv("LADDER_SSH_CONTROL_DIR", str(tmp_path_factory.mktemp("ctl")))
    for k, v in GIT_ID.items():
        monkeypatch.setenv(k, v)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def start_sshd(d: Path) -> SshServer | str:
    """A running server, or why sshd cannot start here."""
    if not Path(SSHD).exists() or not shutil.which("ssh") or not shutil.which("ssh-keygen"):
        return "OpenSSH (openssh-server, openssh-client) is not installed"
    d.mkdir(parents=True, exist_ok=True)
    for key in ("host_key", "user_key"):
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-f", str(d / key)], check=True)
    (d / "authorized_keys").write_text((d / "user_key.pub").read_text())
    os.chmod(d / "authorized_keys", 0o600)
    Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privilege separation directory
    port = free_port()
    (d / "sshd_config").write_text(f"""Port {port}
ListenAddress 127.0.0.1
HostKey {d / 'host_key'}
PidFile {d / 'sshd.pid'}
AuthorizedKeysFile {d / 'authorized_keys'}
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
PermitRootLogin prohibit-password
StrictModes no
UsePAM no
MaxSessions 100
MaxStartups 100
LogLevel ERROR
""")
    user = os.environ.get("USER") or subprocess.run(["id", "-un"], capture_output=True, text=True).stdout.strip()
    (d / "known_hosts").write_text(f"[127.0.0.1]:{port} {(d / 'host_key.pub').read_text().split(' ')[0]} "
                                   f"{(d / 'host_key.pub').read_text().split(' ')[1]}\n")
    server = SshServer(d, port, subprocess.Popen([SSHD, "-D", "-e", "-f", str(d / "sshd_config")],
                                                 stdout=subprocess.DEVNULL, stderr=open(d / "sshd.log", "wb")))
    (d / "ssh_config").write_text(f"""Host {server.alias}
  HostName 127.0.0.1
  Port {port}
  User {user}
  IdentityFile {d / 'user_key'}
  IdentitiesOnly yes
  UserKnownHostsFile {d / 'known_hosts'}
  StrictHostKeyChecking yes
""")
    server.remote_root.mkdir(parents=True)
    end = time.time() + 15
    while time.time() < end:
        if server.proc.poll() is not None:
            return f"sshd exited ({server.proc.returncode}): {(d / 'sshd.log').read_text()[-500:]}"
        p = subprocess.run(["ssh", "-F", str(d / "ssh_config"), "-o", "BatchMode=yes", server.alias, "true"],
                           capture_output=True, text=True, timeout=30)
        if p.returncode == 0:
            return server
        time.sleep(0.3)
    server.stop()
    return f"sshd did not accept a login: {p.stderr.strip()[-500:]}"


def workspace(tmp_path: Path, sshd: "SshServer | None", mode: str = "pass", steps: int = 30, sleep: float = 0.0,
              extra: str = "", setup: str = '["{python} -m venv --without-pip {env}"]') -> Path:
    """A workspace whose target profile runs the fixture program on the server (an unreachable host when None)."""
    ws = tmp_path / "ws"
    ssh_table = (sshd.profile_table(cache=str(sshd.remote_root / "cache")) if sshd is not None
                 else '{ host = "unreachable.invalid", root = "/nonexistent" }')
    (ws / "repo").mkdir(parents=True)
    (ws / "repo" / "train.py").write_text((FIXTURE / "repo" / "train.py").read_text())
    (ws / "ladder.toml").write_text(f"""name = "remote-test"
source = "repo"
[experiment]
short = "{{python}} train.py --steps {{steps}} --seed {{seed}} --mode {{mode}} --sleep {{sleep}}"
full = "{{python}} train.py --steps {{steps}} --seed {{seed}} --mode {{mode}} --sleep {{sleep}}"
short_steps = {steps}
full_steps = {steps}
expected_minutes_short = 1
expected_minutes_full = 1
vars = {{ mode = "{mode}", sleep = "{sleep}" }}
[parse]
loss = '^step (?P<step>\\d+) loss (?P<loss>\\S+)'
metric = '^metric acc=(?P<value>\\S+)'
metric_name = "acc"
direction = "max"
eval = '^eval step (?P<step>\\d+) items (?P<items>\\d+) acc (?P<acc>\\S+)'
[profiles.reference]
platform = "cpu"
price_per_hour = 1.0
[profiles.target]
platform = "cpu"
runner = "ssh"
ssh = {ssh_table}
setup = {setup}
python = "{{env}}/bin/python"
price_per_hour = 2.0
{extra}
""")
    return ws
