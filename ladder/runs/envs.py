"""Python environments for profiles: an interpreter path, or setup commands built once into a cache.

A profile's `setup` commands (like a repo's setup_env.sh) run once into
`$LADDER_CACHE/envs/<hash of the commands>/`; a marker file written last makes a half-built
environment (a crash, a kill) look unbuilt, so the next call rebuilds it. A file lock lets two
processes ask for the same environment at once; its holder writes who it is into the lock file, so
the one that waits can say for whom. Downloads go to pip's own cache, which survives.

A build takes minutes (torch_xla), so it reports as it goes, through the progress callback: each
step, each line the commands print, and a line after each quiet spell. It never prints itself.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import queue
import shutil
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Callable, Iterator

from ladder._util.errors import LadderError

READY = ".ladder-ready"
# (event, data): "env_wait" (holder), "env_step" (index, total, command), "env_output" (line),
# "env_quiet" (index, total, command, seconds), "env_built" (python, seconds); each with the profile's "name"
Progress = Callable[[str, dict], None]
QUIET_S = 30.0  # a step silent this long is reported as still running


def cache_root() -> Path:
    return Path(os.environ.get("LADDER_CACHE", Path.home() / ".cache" / "ladder"))


def env_key(setup: list[str]) -> str:
    return hashlib.sha256(json.dumps(setup).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class Environment:
    python: str
    env_dir: Path | None  # None for an interpreter given by path
    built_now: bool = False


def _fmt(cmd: str, env_dir: Path) -> str:
    return cmd.replace("{env}", str(env_dir)).replace("{python}", sys.executable)


def ensure_env(setup: list[str], python: str = "{env}/bin/python", progress: Progress | None = None,
               name: str = "") -> Environment:
    """Build (once) and return the environment that `setup` describes; `name` (the profile) is for progress."""
    root = cache_root() / "envs"
    root.mkdir(parents=True, exist_ok=True)
    key = env_key(setup)
    env_dir = root / key
    interpreter = python.replace("{env}", str(env_dir))
    emit = _emitter(progress, name)
    with _build_lock(root / f"{key}.lock", emit):
        if (env_dir / READY).exists():
            return Environment(interpreter, env_dir)
        if env_dir.exists():
            shutil.rmtree(env_dir)
        env_dir.mkdir(parents=True)
        started = time.monotonic()
        _run_setup(setup, env_dir, root / f"{key}.build.log", emit)
        if not Path(interpreter).exists():
            raise LadderError(f"setup finished but the interpreter {interpreter} does not exist",
                              "set the profile's `python` to the interpreter the setup creates")
        (env_dir / READY).write_text(json.dumps({"setup": setup}))
        emit("env_built", {"python": interpreter, "seconds": time.monotonic() - started})
        return Environment(interpreter, env_dir, built_now=True)


def _emitter(progress: Progress | None, name: str) -> Progress:
    def emit(event: str, data: dict) -> None:
        if progress:
            progress(event, {"name": name, **data})

    return emit


@contextmanager
def _build_lock(path: Path, emit: Progress) -> Iterator[None]:
    """The exclusive lock on one environment's build; the holder's pid, host and command go into the file."""
    with open(path, "a+") as lock:  # not "w": that would erase the holder's note before we get the lock
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            lock.seek(0)
            emit("env_wait", {"holder": _holder(lock.read())})
            fcntl.flock(lock, fcntl.LOCK_EX)
        lock.seek(0)
        lock.truncate()
        lock.write(json.dumps({"pid": os.getpid(), "host": socket.gethostname(),
                               "command": " ".join([Path(sys.argv[0]).name, *sys.argv[1:]]), "since": time.time()}))
        lock.flush()
        yield  # closing the file releases the lock


def _holder(note: str) -> dict:
    try:
        found = json.loads(note)
    except ValueError:
        return {}  # the holder took the lock and has not written its note yet
    return found if isinstance(found, dict) else {}


def _run_setup(setup: list[str], env_dir: Path, log_path: Path, emit: Progress) -> None:
    with open(log_path, "wb") as log:
        for i, cmd in enumerate(setup, 1):
            line = _fmt(cmd, env_dir)
            step = {"index": i, "total": len(setup), "command": line}
            emit("env_step", step)
            log.write(f"$ {line}\n".encode())
            log.flush()
            rc = _run_step(line, env_dir, log, lambda ev, data: emit(ev, {**step, **data}))
            if rc != 0:
                tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                raise LadderError(
                    f"environment setup command failed (exit {rc}): {line}\n{tail}",
                    f"fix the profile's setup commands; full log: {log_path}",
                )


def _run_step(line: str, env_dir: Path, log: IO[bytes], emit: Progress) -> int:
    """Run one setup command; its output goes to the log and, line by line, to progress."""
    started = time.monotonic()
    proc = subprocess.Popen(line, shell=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, cwd=env_dir,
                            env={**os.environ, "PYTHONUNBUFFERED": "1"})
    try:
        for raw in _lines(proc.stdout, QUIET_S):  # type: ignore[arg-type]
            if raw is None:
                emit("env_quiet", {"seconds": time.monotonic() - started})
                continue
            log.write(raw)
            log.flush()
            text = raw.decode(errors="replace").rstrip()
            if text:
                emit("env_output", {"line": text})
        return proc.wait()
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def _lines(stream: IO[bytes], quiet_s: float) -> Iterator[bytes | None]:
    """The stream's lines as they come (pip rewrites a line with \\r: each rewrite counts); None after each
    `quiet_s` without one."""
    lines: queue.Queue[bytes] = queue.Queue()

    def pump() -> None:
        for raw in iter(lambda: stream.readline(), b""):
            for part in raw.split(b"\r"):
                if part.strip():
                    lines.put(part if part.endswith(b"\n") else part + b"\n")
        lines.put(b"")

    threading.Thread(target=pump, daemon=True).start()
    while True:
        try:
            raw = lines.get(timeout=quiet_s)
        except queue.Empty:
            yield None
            continue
        if not raw:
            return
        yield raw


def resolve_interpreter(python: str | None) -> str:
    """An interpreter named by path or by command name, checked to exist."""
    if not python:
        return sys.executable
    found = shutil.which(python) if os.sep not in python else (python if Path(python).exists() else None)
    if not found:
        raise LadderError(f"interpreter {python!r} not found", "give an absolute path or a command on PATH")
    return found


def package_list(python: str, timeout: float = 120) -> list[str]:
    """`pip freeze` of an environment (empty when pip is absent: recorded, not fatal)."""
    env_dir = Path(python).resolve().parent.parent
    cached = env_dir / ".ladder-freeze.json"
    if (env_dir / READY).exists() and cached.exists():
        return json.loads(cached.read_text())
    try:
        out = subprocess.run([python, "-m", "pip", "freeze", "--all"], capture_output=True, text=True,
                             timeout=timeout, env={**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1"})
        pkgs = out.stdout.split() if out.returncode == 0 else []
    except (OSError, subprocess.TimeoutExpired):
        pkgs = []
    if (env_dir / READY).exists() and pkgs:
        cached.write_text(json.dumps(pkgs))
    return pkgs
