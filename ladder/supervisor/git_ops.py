"""Git for attempts: one branch and worktree per attempt, commits that carry the declared level."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import git

from ladder._util.errors import LadderError

# Paths an agent's change may never touch, relative to the repository root.
PROTECTED = ("baselines/", "journals/", "protocols/", ".ladder/", "ladder.toml")
TRAILER = re.compile(r"^Declared-Level: (?P<level>L[0-4]|none)$", re.MULTILINE)


def open_repo(source: Path) -> git.Repo:
    try:
        return git.Repo(source)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise LadderError(f"{source} is not a git repository",
                          "the port must live in git: `git init && git add -A && git commit -m original`") from None


def branch_name(attempt: int) -> str:
    return f"ladder/attempt-{attempt}"


def worktree_path(workspace: Path, attempt: int) -> Path:
    return workspace / ".ladder" / "worktrees" / f"attempt-{attempt}"


def fresh_worktree(repo: git.Repo, workspace: Path, attempt: int, base: str) -> Path:
    """A clean worktree on branch ladder/attempt-N at `base` (re-created if a previous try left one)."""
    path = worktree_path(workspace, attempt)
    if path.exists():
        try:
            repo.git.worktree("remove", "--force", str(path))
        except git.GitCommandError:
            shutil.rmtree(path, ignore_errors=True)
    repo.git.worktree("prune")
    path.parent.mkdir(parents=True, exist_ok=True)
    repo.git.worktree("add", "-f", "-B", branch_name(attempt), str(path), base)
    return path


def commit_attempt(worktree: Path, attempt: int, declared: str | None, summary: str) -> tuple[str, str]:
    """Commit everything the agent changed; return (commit sha, diff stat against the parent)."""
    wt = git.Repo(worktree)
    wt.git.add("-A")
    first = (summary.strip().splitlines() or ["(no summary)"])[0][:72]
    message = (f"ladder attempt {attempt}: {first}\n\n{summary.strip()}\n\n"
               f"Ladder-Attempt: {attempt}\nDeclared-Level: {declared or 'none'}\n")
    reader = wt.config_reader()
    identity = [] if reader.has_option("user", "email") else ["-c", "user.name=ladder", "-c", "user.email=ladder@localhost"]
    wt.git.execute(["git", *identity, "commit", "--allow-empty", "-m", message, "--no-verify"])
    stat = wt.git.diff("--stat", "HEAD~1", "HEAD")
    return wt.head.commit.hexsha, stat


def declared_in_commit(repo: git.Repo, sha: str) -> str | None:
    m = TRAILER.search(repo.commit(sha).message)
    return None if m is None or m.group("level") == "none" else m.group("level")


def changed_paths(repo: git.Repo, base: str, head: str) -> list[str]:
    return [line for line in repo.git.diff("--name-only", base, head).splitlines() if line]


def protected_changes(paths: list[str]) -> list[str]:
    return [p for p in paths if any(p == x.rstrip("/") or p.startswith(x) for x in PROTECTED)]


def uncommitted(worktree: Path) -> bool:
    return git.Repo(worktree).is_dirty(untracked_files=True)
