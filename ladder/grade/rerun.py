"""The fresh re-run of `ladder grade`: the final attempt's branch cloned into a new directory without its
git history, an environment built only from the port's own setup file, and the full experiment run.

Owns: the clone, the environment from the setup file (built once by ladder's environment cache, keyed
by the file's content, not its path), and the stage-2 diff guard. Must not: judge the run (the grader
applies the ladder's checks and the integrity judges), or touch the migration's worktrees and branches.
"""

from __future__ import annotations

import fnmatch
import hashlib
import shutil
import subprocess
from pathlib import Path

from ladder._util.errors import LadderError
from ladder.runs.envs import Environment, cache_root, ensure_env

SETUP_FILES_DIR = "setup-files"


def clone_branch(repo: Path, branch: str, dst: Path) -> str:
    """Clone one branch of `repo` into `dst` and drop its history (XStack copies the port without git).
    Returns the commit that was cloned."""
    if dst.exists():
        shutil.rmtree(dst)
    p = subprocess.run(["git", "clone", "--quiet", "--no-hardlinks", "--single-branch", "--branch", branch,
                        str(repo), str(dst)], capture_output=True, text=True)
    if p.returncode != 0:
        raise LadderError(f"cannot clone branch {branch!r} of {repo}: {p.stderr.strip()[:500]}",
                          "pass --branch with a branch of the source repository")
    commit = subprocess.run(["git", "rev-parse", "HEAD"], cwd=dst, capture_output=True, text=True).stdout.strip()
    shutil.rmtree(dst / ".git")
    return commit


def setup_commands(setup_file: Path) -> list[str]:
    """The environment cache's commands for a port's setup file: a copy of the file under the cache, named by
    its content, so that the same file builds one environment wherever the clone lies.
    requirements*.txt: a fresh venv and `pip install -r`. A shell script: `bash FILE ENV_DIR`, with ladder's
    Python in $PYTHON; it must leave ENV_DIR/bin/python."""
    if not setup_file.is_file():
        raise LadderError(f"the port has no setup file {setup_file.name}",
                          "commit it to the port, or fix [grade].setup in the spec")
    data = setup_file.read_bytes()
    digest = hashlib.sha256(data).hexdigest()[:16]
    kept = cache_root() / SETUP_FILES_DIR / digest / setup_file.name
    kept.parent.mkdir(parents=True, exist_ok=True)
    if not kept.is_file():
        kept.write_bytes(data)
    if setup_file.suffix == ".txt":
        return ["{python} -m venv {env}", f"{{env}}/bin/pip install --quiet -r {kept}"]
    return [f"PYTHON={{python}} bash {kept} {{env}}"]


def setup_environment(setup_file: Path, progress=None) -> Environment:  # noqa: ANN001
    return ensure_env(setup_commands(setup_file), "{env}/bin/python", progress)


def changed_paths(repo: Path, base: str, head: str) -> list[str]:
    p = subprocess.run(["git", "diff", "--name-only", f"{base}..{head}"], cwd=repo, capture_output=True, text=True)
    if p.returncode != 0:
        raise LadderError(f"cannot diff {base}..{head} in {repo}: {p.stderr.strip()[:300]}",
                          "pass commits or branches of the source repository")
    return [line for line in p.stdout.splitlines() if line]


def diff_text(repo: Path, base: str, head: str) -> str:
    p = subprocess.run(["git", "diff", f"{base}..{head}"], cwd=repo, capture_output=True, text=True)
    return p.stdout if p.returncode == 0 else ""


def stage2_refusals(paths: list[str], allowed: list[str], entry: str) -> list[str]:
    """The changed paths a frozen second stage may not change (protocol [grade].stage2_allowed)."""
    patterns = [a.replace("{entry}", entry) for a in allowed]
    return [p for p in paths if not any(fnmatch.fnmatchcase(p, pat) for pat in patterns)]
