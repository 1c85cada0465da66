"""Small helpers shared by tests: copy a fixture workspace, run the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def workspace(tmp_path: Path, name: str = "tiny") -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def ladder_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "LADDER_PLAIN": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ladder", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def cli_json(*args: str, cwd: Path, env: dict | None = None, ok_codes=(0,)) -> dict:
    p = ladder_cli(*args, "--json", cwd=cwd, env=env)
    assert p.returncode in ok_codes, f"exit {p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}"
    return json.loads(p.stdout)


def set_var(ws: Path, key: str, value: str) -> None:
    """Edit a top-level-table var of the workspace's ladder.toml (tests use `extra` for flags)."""
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace(f'{key} = ""', f'{key} = "{value}"'))
