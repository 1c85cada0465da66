"""Python environments for profiles: an interpreter path, or setup commands built once into a cache.

A profile's `setup` commands (like a repo's setup_env.sh) run once into
`$LADDER_CACHE/envs/<hash of the commands>/`; a marker file written last makes a half-built
environment (a crash, a kill) look unbuilt, so the next call rebuilds it. A file lock lets two
processes ask for the same environment at once. Downloads go to pip's own cache, which survives.
"""

from __future__ import annotations

import fcntl
import hashlib
import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ladder._util.errors import LadderError

READY = ".ladder-ready"
Progress = Callable[[str], None]


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


def ensure_env(setup: list[str], python: str = "{env}/bin/python",
               progress: Progress | None = None) -> Environment:
    """Build (once) and return the environment that `setup` describes."""
    root = cache_root() / "envs"
    root.mkdir(parents=True, exist_ok=True)
    key = env_key(setup)
    env_dir = root / key
    interpreter = python.replace("{env}", str(env_dir))
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if (env_dir / READY).exists():
            return Environment(interpreter, env_dir)
        if env_dir.exists():
            shutil.rmtree(env_dir)
        env_dir.mkdir(parents=True)
        log_path = root / f"{key}.build.log"
        with open(log_path, "wb") as log:
            for i, cmd in enumerate(setup, 1):
                line = _fmt(cmd, env_dir)
                if progress:
                    progress(f"[{i}/{len(setup)}] {line}")
                log.write(f"$ {line}\n".encode())
                log.flush()
                rc = subprocess.run(line, shell=True, stdout=log, stderr=subprocess.STDOUT,
                                    cwd=env_dir).returncode
                if rc != 0:
                    tail = log_path.read_bytes()[-3000:].decode(errors="replace")
                    raise LadderError(
                        f"environment setup command failed (exit {rc}): {line}\n{tail}",
                        f"fix the profile's setup commands; full log: {log_path}",
                    )
        if not Path(interpreter).exists():
            raise LadderError(f"setup finished but the interpreter {interpreter} does not exist",
                              "set the profile's `python` to the interpreter the setup creates")
        (env_dir / READY).write_text(json.dumps({"setup": setup}))
        return Environment(interpreter, env_dir, built_now=True)


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
