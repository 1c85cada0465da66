"""One remote machine as ladder drives it over ssh: the agent's bundle shipped once, calls to the agent, the
clock offset, files in and out, and a run's logs followed from byte offsets across dropped connections.

A dropped connection is re-opened with a doubling backoff ([infrastructure] of the protocol); `follow`
continues at the byte offsets it had reached, so no line is lost or repeated. When the machine stays out of
reach, or the run vanished there without an exit record (the machine was preempted or rebooted), the
failure is raised as InfrastructureFailure with its kind: never a failure of the code under test.
Must not: build run records (that is `execute`), or decide whether a run may start (the agent refuses a
second start of the same directory).
"""

from __future__ import annotations

import json
import subprocess
import tarfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, TypeVar

from ladder.migration.protocol import Infrastructure
from ladder.runs.remote.agent import PREPARE_REFUSED
from ladder.runs.remote.bundle import AGENT, bundle
from ladder.runs.remote.ssh import RemoteError, SshConnection, TransportError, json_reply, shell

T = TypeVar("T")
RawSink = Callable[[str, float, str], None]  # (stream, seconds since the run's start on its clock, text)
Notify = Callable[[str], None]

_HELLO = ("import json,os,socket,sys,time;r=os.path.abspath(os.path.expanduser(sys.argv[1]));"
          "l=os.path.join(r,'lib',sys.argv[2]);print(json.dumps({'root':r,'lib':l,'time':time.time(),"
          "'ready':os.path.exists(os.path.join(l,'.ready')),'host':socket.gethostname(),"
          "'python':list(sys.version_info[:2])}))")
_UNPACK = ("import io,os,shutil,sys,tarfile;l=sys.argv[1];t=l+'.tmp%d'%os.getpid();"
           "tarfile.open(fileobj=io.BytesIO(sys.stdin.buffer.read()),mode='r:gz').extractall(t);"
           "open(os.path.join(t,'.ready'),'w').close();os.makedirs(os.path.dirname(l),exist_ok=True)\n"
           "try:\n os.rename(t,l)\nexcept OSError:\n shutil.rmtree(t)\nprint('{}')")
MIN_PYTHON = (3, 9)


class InfrastructureFailure(Exception):
    """The machine or the connection failed, not the run: `kind` is one of records.INFRASTRUCTURE_KINDS."""

    def __init__(self, kind: str, detail: str) -> None:
        super().__init__(f"{kind}: {detail}")
        self.kind = kind
        self.detail = detail


@dataclass
class Reconnects:
    """Counts the connections re-opened during one run (recorded in run.json)."""

    policy: Infrastructure
    notify: Notify | None = None
    count: int = 0
    log: list[str] = field(default_factory=list)

    def retry(self, fn: Callable[[], T], what: str) -> T:
        tries = 0
        while True:
            try:
                return fn()
            except TransportError as e:
                tries += 1
                self.wait(tries, what, e)

    def wait(self, tries: int, what: str, error: Exception) -> None:
        if tries > self.policy.reconnect_tries:
            raise InfrastructureFailure("connection_lost", f"{what}: the machine stayed out of reach after "
                                        f"{self.policy.reconnect_tries} tries ({error})")
        delay = min(self.policy.reconnect_backoff_s * 2 ** (tries - 1), self.policy.reconnect_backoff_max_s)
        self.count += 1
        self.log.append(f"{time.strftime('%H:%M:%S')} {what}: connection lost ({str(error)[:200]}); "
                        f"try {tries} in {delay:.1f}s")
        if self.notify:
            self.notify(self.log[-1])
        time.sleep(delay)


class Machine:
    """A machine reached over ssh, with ladder's agent bundle unpacked under its root."""

    def __init__(self, conn: SshConnection, root: str, python: str, reconnects: Reconnects) -> None:
        self.conn, self.python, self.reconnects = conn, python, reconnects
        digest, data = bundle()
        hello = self._hello(root, digest)
        if tuple(hello["python"]) < MIN_PYTHON:
            raise RemoteError(f"{python} on {conn.host} is Python {'.'.join(map(str, hello['python']))}; ladder's "
                              f"agent needs {'.'.join(map(str, MIN_PYTHON))}+ (set ssh.python in the profile)")
        self.root, self.lib, self.hostname = hello["root"], hello["lib"], hello["host"]
        if not hello["ready"]:
            json_reply(reconnects.retry(lambda: conn.run(shell(python, "-c", _UNPACK, self.lib), data),
                                        "shipping the agent"), "unpacking ladder's agent")

    def _hello(self, root: str, digest: str) -> dict[str, Any]:
        p = self.reconnects.retry(lambda: self.conn.run(shell(self.python, "-c", _HELLO, root, digest), timeout=120),
                                  "connecting")
        return json_reply(p, f"running {self.python} on {self.conn.host}")

    @property
    def probe_dir(self) -> str:
        return f"{self.lib}/ladder/probe"

    def _agent(self, *args: str) -> str:
        return shell(self.python, f"{self.lib}/{AGENT}", *args)

    def call(self, *args: str, stdin: bytes | None = None, timeout: float = 600.0) -> dict[str, Any]:
        p = self.reconnects.retry(lambda: self.conn.run(self._agent(*args), stdin, timeout), args[0])
        return json_reply(p, f"ladder's agent `{args[0]}` on {self.conn.host}")

    def clock_offset(self, samples: int = 5) -> tuple[float, float]:
        """(that machine's clock minus ours, round trip) from the fastest of a few round trips over one open
        channel (NTP's midpoint rule: the error is at most half that round trip)."""

        def once() -> tuple[float, float]:
            proc = self.conn.stream(self._agent("clock"), pipe_stdin=True)
            assert proc.stdin is not None and proc.stdout is not None
            best: tuple[float, float] | None = None
            try:
                for i in range(samples + 1):  # the first answer pays for the interpreter's start: dropped
                    t0 = time.time()
                    proc.stdin.write(b"\n")
                    proc.stdin.flush()
                    line = proc.stdout.readline()
                    t1 = time.time()
                    if not line:
                        raise TransportError(proc.stderr.read().decode(errors="replace")[-300:])  # type: ignore[union-attr]
                    sample = (json.loads(line)["time"] - (t0 + t1) / 2, t1 - t0)
                    if i > 0 and (best is None or sample[1] < best[1]):
                        best = sample
            finally:
                proc.stdin.close()
                proc.wait()
            assert best is not None
            return best

        return self.reconnects.retry(once, "measuring the clock")

    def prepare(self, request: dict[str, Any], on_line: Notify | None) -> dict[str, Any]:
        """Build the environment there (streamed progress), once per hash of its setup commands."""

        def once() -> dict[str, Any]:
            proc = self.conn.stream(self._agent("prepare"), stdin=json.dumps(request).encode())
            err: list[str] = []

            def pump() -> None:
                for raw in proc.stderr:  # type: ignore[union-attr]
                    line = raw.decode(errors="replace").rstrip()
                    err.append(line)
                    if on_line:
                        on_line(line)

            th = threading.Thread(target=pump, daemon=True)
            th.start()
            out = proc.stdout.read()  # type: ignore[union-attr]
            rc = proc.wait()
            th.join(timeout=5)
            if rc == 255:
                raise TransportError("\n".join(err[-5:]))
            if rc == PREPARE_REFUSED and out.strip():
                rc = 0  # the agent's answer is its reply (a failed build, a spec problem), not a crash
            return json_reply(subprocess.CompletedProcess([], rc, out, "\n".join(err).encode()), "prepare")

        return self.reconnects.retry(once, "building the environment")

    def put_dir(self, local: Path, remote: str) -> None:
        """Copy a directory's contents into `remote` (a tar stream to the agent's unpack)."""

        def once() -> None:
            proc = self.conn.stream(self._agent("unpack", remote), stdin=None, pipe_stdin=True)
            with tarfile.open(fileobj=proc.stdin, mode="w|gz") as tar:  # type: ignore[arg-type]
                for p in sorted(local.iterdir()):
                    tar.add(p, arcname=p.name)
            proc.stdin.close()  # type: ignore[union-attr]
            out, err = proc.stdout.read(), proc.stderr.read()  # type: ignore[union-attr]
            rc = proc.wait()
            if rc == 255:
                raise TransportError(err.decode(errors="replace"))
            json_reply(subprocess.CompletedProcess([], rc, out, err), "copying the code")

        self.reconnects.retry(once, "copying the code")

    def get_files(self, remote: str, names: list[str], local: Path) -> None:
        """Copy named files and directories of `remote` into `local` (replacing what is there)."""

        def once() -> None:
            proc = self.conn.stream(self._agent("pack", remote, *names))
            with tarfile.open(fileobj=proc.stdout, mode="r|gz") as tar:  # type: ignore[arg-type]
                for member in tar:
                    if member.name.startswith(("/", "..")) or "/../" in member.name or member.issym() or member.islnk():
                        continue
                    tar.extract(member, local)
            err = proc.stderr.read()  # type: ignore[union-attr]
            rc = proc.wait()
            if rc == 255:
                raise TransportError(err.decode(errors="replace"))
            if rc != 0:
                raise RemoteError(f"collecting the run's files failed: {err.decode(errors='replace')[-800:]}")

        try:
            self.reconnects.retry(once, "collecting the results")
        except tarfile.ReadError as e:
            raise TransportError(f"the results' tar stream broke: {e}") from e

    def follow(self, remote: str, offsets: dict[str, int], sink: RawSink) -> dict[str, Any]:
        """Stream the run's log lines from `offsets` (updated in place) until it ends; its exit record."""
        tries = 0
        while True:
            proc = self.conn.stream(self._agent("follow", remote, str(offsets["stdout"]), str(offsets["stderr"])))
            assert proc.stdout is not None
            for raw in proc.stdout:
                tag, _, rest = raw.partition(b" ")
                if tag in (b"O", b"E"):
                    off, _, line = rest.partition(b" ")
                    stream = "stdout" if tag == b"O" else "stderr"
                    t_text, _, text = line.decode("utf-8", errors="replace").rstrip("\r\n").partition("\t")
                    sink(stream, float(t_text), text)
                    offsets[stream] = int(off)
                    tries = 0
                elif tag == b"X":
                    proc.wait()
                    return json.loads(rest)
                elif tag == b"L":
                    proc.wait()
                    st = json.loads(rest)
                    raise InfrastructureFailure("remote_lost", f"the run on {self.hostname} ended without an exit record "
                                                f"({st.get('state')}): its machine was preempted, rebooted or "
                                                f"killed the run's supervisor")
            rc = proc.wait()
            err = proc.stderr.read().decode(errors="replace") if proc.stderr else ""  # type: ignore[union-attr]
            if rc not in (0, 255):
                raise RemoteError(f"following the run failed (exit {rc}): {err[-800:]}")
            tries += 1
            self.reconnects.wait(tries, "following the run", TransportError(err.strip()[-300:] or f"exit {rc}"))

    def status(self, remote: str) -> dict[str, Any]:
        return self.call("status", remote)

    def kill(self, remote: str, grace_s: float) -> dict[str, Any]:
        return self.call("kill", remote, str(grace_s))

    def remove(self, remote: str) -> None:
        self.reconnects.retry(lambda: self.conn.run(shell("rm", "-rf", "--", remote)), "cleaning up")
