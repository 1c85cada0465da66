"""Where the code under test came from: git commit and a hash of uncommitted changes."""

from __future__ import annotations

import hashlib
import socket
from pathlib import Path

from ladder.runs.records import Provenance


# What ladder itself writes into a workspace is not part of the code under test.
LADDER_OUTPUTS = ("runs", "baselines", "journals", ".ladder")


def git_state(source: Path) -> tuple[str | None, bool, str | None]:
    """(commit, dirty, sha256 of `git diff HEAD` + untracked files) or (None, False, None) outside git."""
    try:
        import git

        repo = git.Repo(source, search_parent_directories=True)
        commit = repo.head.commit.hexsha
    except Exception:
        return None, False, None
    h = hashlib.sha256()
    diff = repo.git.diff("HEAD", "--binary", "--", str(source), *[f":(exclude){o}" for o in LADDER_OUTPUTS])
    h.update(diff.encode())
    top = Path(repo.working_tree_dir)
    untracked = []
    for f in repo.untracked_files:
        p = (top / f).resolve()
        if p.is_relative_to(source.resolve()) and p.relative_to(source.resolve()).parts[0] not in LADDER_OUTPUTS:
            untracked.append(f)
    for rel in sorted(untracked):
        p = Path(repo.working_tree_dir) / rel
        h.update(rel.encode() + b"\0")
        if p.is_file():
            h.update(p.read_bytes())
    dirty = bool(diff or untracked)
    return commit, dirty, (h.hexdigest() if dirty else None)


def provenance(source: Path, python: str, packages: list[str]) -> Provenance:
    commit, dirty, changes = git_state(source)
    return Provenance(source=str(source), git_commit=commit, git_dirty=dirty, uncommitted_sha256=changes,
                      packages=packages, python=python, hostname=socket.gethostname())
