"""Git for attempts: one branch and worktree per attempt, commits that carry the declared level."""

from __future__ import annotations

import re
import shutil
from pathlib import Path

import git

from ladder._util.errors import LadderError

from ladder.migration.workspace import PROTECTED_PATHS as PROTECTED
TRAILER = re.compile(r"^Declared-Level: (?P<level>L[0-4]|none)$", re.MULTILINE)
HEAD_TRAILER = re.compile(r"^Journal-Head: (?P<seq>\d+) (?P<sha>[0-9a-f]{64})$", re.MULTILINE)
HEAD_TAG = "ladder/journal-head"


def open_repo(source: Path) -> git.Repo:
    try:
        return git.Repo(source)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        raise LadderError(f"{source} is not a git repository",
                          "the port must live in git: `git init && git add -A && git commit -m original`") from None


def branch_name(attempt: int) -> str:
    return f"ladder/attempt-{attempt}"


def worktree_path(workspace: Path, attempt: int) -> Path:
    """Where attempt N's worktree lives: outside the workspace (ladder's cache), so that an agent working in
    it reaches neither the baselines, the journal nor ladder.toml through a relative path."""
    import hashlib

    from ladder.runs.envs import cache_root

    tag = hashlib.sha256(str(Path(workspace).resolve()).encode()).hexdigest()[:12]
    return cache_root() / "worktrees" / f"{Path(workspace).resolve().name}-{tag}" / f"attempt-{attempt}"


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


def commit_attempt(worktree: Path, attempt: int, declared: str | None, summary: str,
                   journal_head: tuple[int, str] | None = None) -> tuple[str, str]:
    """Commit everything the agent changed; return (commit sha, diff stat against the parent). The commit
    carries the journal's head at that moment: an anchor outside the journal (verify_journal)."""
    wt = git.Repo(worktree)
    wt.git.add("-A")
    first = (summary.strip().splitlines() or ["(no summary)"])[0][:72]
    anchor = f"Journal-Head: {journal_head[0]} {journal_head[1]}\n" if journal_head else ""
    message = (f"ladder attempt {attempt}: {first}\n\n{summary.strip()}\n\n"
               f"Ladder-Attempt: {attempt}\nDeclared-Level: {declared or 'none'}\n{anchor}")
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


def anchor_tag(repo: git.Repo, migration: str, journal_head: tuple[int, str]) -> None:
    """The journal's final head, in an annotated tag of the source repository (the tail's anchor)."""
    reader = repo.config_reader()
    identity = [] if reader.has_option("user", "email") else ["-c", "user.name=ladder", "-c", "user.email=ladder@localhost"]
    repo.git.execute(["git", *identity, "tag", "-f", "-a", f"{HEAD_TAG}/{migration}", "-m",
                      f"ladder journal of {migration}\n\nJournal-Head: {journal_head[0]} {journal_head[1]}\n"])


def journal_anchors(source: Path, migration: str | None = None) -> list[tuple[int, str, str]]:
    """(seq, entry hash, where) of every journal head the attempts' commits and the final tag recorded."""
    try:
        repo = git.Repo(source, search_parent_directories=True)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        return []
    out: list[tuple[int, str, str]] = []
    seen: set[str] = set()
    for ref in repo.references:
        name = ref.path
        if not (name.startswith("refs/heads/ladder/attempt-") or name.startswith(f"refs/tags/{HEAD_TAG}/")):
            continue
        if migration and name.startswith("refs/tags/") and not name.endswith(f"/{migration}"):
            continue
        if name.startswith("refs/tags/"):
            tag = ref.tag if hasattr(ref, "tag") else None
            text = tag.message if tag is not None else ""
            for m in HEAD_TRAILER.finditer(text):
                out.append((int(m.group("seq")), m.group("sha"), f"tag {name[len('refs/tags/'):]}"))
            continue
        for commit in repo.iter_commits(name, max_count=50):
            if commit.hexsha in seen:
                continue
            seen.add(commit.hexsha)
            for m in HEAD_TRAILER.finditer(commit.message):
                out.append((int(m.group("seq")), m.group("sha"), f"commit {commit.hexsha[:10]}"))
    return sorted(set(out))
