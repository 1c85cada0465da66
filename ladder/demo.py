"""`ladder demo`: the embedded default. A real PyTorch repo, a real port, supervised end to end.

Copies examples/classifier into a fresh workspace with its own git repository, builds (once, cached)
the reference and target environments, and runs the supervisor with the recorded scripted migration
for the chosen target. Everything it shows comes from real runs made now.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any, Callable

from ladder._util.errors import LadderError
from ladder.runs.execute import profile_environment
from ladder.migration.spec import load_spec
from ladder.supervisor.driver import SupervisorStatus, supervise

EXAMPLE = Path(__file__).resolve().parent.parent / "examples" / "classifier"
TARGETS = {"xla": "ladder.toml", "jax": "ladder-jax.toml"}
MARKER = ".ladder-demo"
DEMO_SEEDS = 5


def prepare_workspace(target: str, directory: Path) -> Path:
    """A fresh copy of the example: ladder.toml, the scripted migration, and repo/ as a git repository."""
    if target not in TARGETS:
        raise LadderError(f"unknown demo target {target!r}", f"use one of {sorted(TARGETS)}")
    if directory.exists() and any(directory.iterdir()):
        if not (directory / MARKER).exists():
            raise LadderError(f"{directory} exists and is not a ladder demo directory",
                              "pass --dir with a new or empty directory")
        shutil.rmtree(directory)
    directory.mkdir(parents=True, exist_ok=True)
    (directory / MARKER).write_text(target)
    shutil.copy2(EXAMPLE / TARGETS[target], directory / "ladder.toml")
    shutil.copytree(EXAMPLE / "migrations", directory / "migrations")
    # the recorded attempts start from the faithful ports (and patch them where the agent went wrong)
    shutil.copytree(EXAMPLE / "ports", directory / "ports", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copytree(EXAMPLE / "repo", directory / "repo", ignore=shutil.ignore_patterns("__pycache__"))
    git = ["git", "-c", "user.name=ladder demo", "-c", "user.email=demo@ladder.invalid"]
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                [*git, "commit", "-q", "-m", "the original PyTorch training repo"]):
        subprocess.run(cmd, cwd=directory / "repo", check=True, capture_output=True)
    return directory


def build_environments(workspace: Path, progress: Callable[[str, dict], None] | None = None) -> dict[str, str]:
    spec = load_spec(workspace / "ladder.toml")
    out = {}
    for name in ("reference", "target"):
        if progress:
            progress("env", {"message": f"{name} environment ({spec.profile(name).platform})"})
        out[name] = profile_environment(spec.profile(name), progress, name).python
    return out


def run_demo(target: str, directory: Path, progress: Any = None) -> tuple[Path, SupervisorStatus]:
    from ladder.migration.workspace import WorkspaceLock

    workspace = prepare_workspace(target, directory)
    with WorkspaceLock(workspace, "demo"):
        build_environments(workspace, progress)
        status = supervise(workspace / "ladder.toml", f"scripted:migrations/{target}.toml", max_attempts=10,
                           seeds=DEMO_SEEDS, full_seeds=1, progress=progress)
    return workspace, status
