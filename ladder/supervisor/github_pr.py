"""One pull request per attempt on GitHub: push the attempt's branch, open its PR, update it with results.

This module owns the git push (gitpython) and the GitHub REST calls (PyGithub), and the markdown of
a PR body rendered from a journal entry. It does not decide when to open or update a PR (the
supervisor does) and it never writes the token anywhere: pushes use the remote's own credentials
(credential helper, SSH key), and the token only authenticates REST calls.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import git
from github import Auth, Github, GithubException
from github.Repository import Repository

from ladder._util.errors import LadderError

DEFAULT_API_URL = "https://api.github.com"
TOKEN_ENV = "GITHUB_TOKEN"
# GitHub Actions sets this to the API of the server it runs on (GitHub Enterprise included).
API_URL_ENV = "GITHUB_API_URL"


def _fail(what: str, e: GithubException) -> LadderError:
    message = e.data.get("message") if isinstance(e.data, dict) else e.data
    return LadderError(
        f"GitHub refused to {what}: HTTP {e.status} {message}",
        f"check that {TOKEN_ENV} can write pull requests on the repository and that the repository exists",
    )


class PullRequests:
    """Pull requests of one GitHub repository, one per attempt branch."""

    def __init__(self, repo_full_name: str, token: str, base_url: str = DEFAULT_API_URL,
                 remote: str = "origin") -> None:
        if repo_full_name.count("/") != 1 or not all(repo_full_name.split("/")):
            raise LadderError(f"github repository {repo_full_name!r} is not owner/name", "write it as owner/name")
        self.repo_full_name = repo_full_name
        self.owner = repo_full_name.split("/")[0]
        self.remote = remote
        self._github = Github(auth=Auth.Token(token), base_url=base_url.rstrip("/"))
        self._repo: Repository | None = None

    def _gh_repo(self) -> Repository:
        if self._repo is None:
            try:
                self._repo = self._github.get_repo(self.repo_full_name)
            except GithubException as e:
                raise _fail(f"show {self.repo_full_name}", e) from e
        return self._repo

    def push(self, worktree: Path, branch: str) -> None:
        """Push `branch` from the worktree's repository to the remote, under the same name."""
        try:
            repo = git.Repo(worktree)
            remote = repo.remote(self.remote)
            infos = remote.push(refspec=f"refs/heads/{branch}:refs/heads/{branch}")
            infos.raise_if_error()
        except ValueError as e:  # gitpython: no such remote
            raise LadderError(f"{worktree}: no git remote {self.remote!r}", f"git remote add {self.remote} <url>") from e
        except git.GitCommandError as e:
            raise LadderError(f"pushing {branch} to {self.remote} failed: {e.stderr.strip() or e}",
                              "check the remote's URL and credentials (git push works by hand)") from e
        rejected = [i for i in infos if i.flags & (git.PushInfo.ERROR | git.PushInfo.REJECTED | git.PushInfo.REMOTE_REJECTED)]
        if rejected or not infos:
            summary = "; ".join(i.summary.strip() for i in rejected) or "nothing was pushed"
            raise LadderError(f"pushing {branch} to {self.remote} was rejected: {summary}",
                              "the remote branch moved; ladder owns ladder/attempt-* branches, so delete the remote one")

    def open_for_attempt(self, worktree: Path, branch: str, base: str, title: str, body: str) -> int:
        """Push `branch`, then open a PR from it into `base`; an open PR for that head is reused.
        Returns the PR number."""
        self.push(worktree, branch)
        repo = self._gh_repo()
        try:
            existing = list(repo.get_pulls(state="open", head=f"{self.owner}:{branch}", base=base))
            if existing:
                return existing[0].number
            return repo.create_pull(base=base, head=branch, title=title, body=body).number
        except GithubException as e:
            raise _fail(f"open a pull request from {branch} into {base}", e) from e

    def update(self, number: int, body: str, labels: list[str] | None = None) -> None:
        """Replace PR `number`'s body (results are appended by re-rendering) and add `labels`."""
        repo = self._gh_repo()
        try:
            pr = repo.get_pull(number)
            pr.edit(body=body)
            if labels:
                pr.add_to_labels(*labels)
        except GithubException as e:
            raise _fail(f"update pull request #{number}", e) from e


def pull_requests_from_env(github_repo: str | None, base_url: str | None,
                           remote: str = "origin") -> PullRequests | None:
    """PullRequests when the spec names a GitHub repository and GITHUB_TOKEN is set, else None."""
    token = os.environ.get(TOKEN_ENV, "").strip()
    if not github_repo or not token:
        return None
    return PullRequests(github_repo, token, base_url or os.environ.get(API_URL_ENV) or DEFAULT_API_URL, remote)


def _cell(value: Any) -> str:
    if value is None or value == "":
        return "–"
    text = value if isinstance(value, str) else (f"{value:.6g}" if isinstance(value, float) else str(value))
    return text.replace("|", "\\|").replace("\r", "").replace("\n", "<br>")


def _table(header: list[str], rows: list[list[Any]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(_cell(v) for v in row) + " |" for row in rows]
    return lines


def render_pr_body(attempt: dict[str, Any], checks: list[dict[str, Any]] | None = None,
                   notes: list[dict[str, Any]] | None = None) -> str:
    """A PR body from a journal attempt entry, its check results and its failure notes (markdown)."""
    number = attempt.get("attempt", "?")
    lines = [f"## ladder attempt {number}", "", attempt.get("summary") or "(no summary)", ""]
    facts = [
        ["Declared level (sealed before checks)", attempt.get("declared_level")],
        ["Achieved level", attempt.get("achieved_level") or ("pending" if checks is None else None)],
        ["Builds on", None if attempt.get("parent") is None else f"attempt {attempt['parent']}"],
        ["Branch", attempt.get("branch")],
        ["Commit", attempt.get("commit")],
        ["Agent", attempt.get("agent")],
        ["Agent cost (USD)", attempt.get("cost_usd")],
    ]
    lines += _table(["", ""], [row for row in facts if row[1] not in (None, "")])
    if attempt.get("rationale"):
        lines += ["", "**Rationale given with the declaration:**", "", "> " + attempt["rationale"].replace("\n", "\n> ")]
    lines += ["", "### Checks", ""]
    if checks is None:
        lines.append("_Not run yet: this pull request is updated when the checks finish._")
    elif not checks:
        lines.append("_No checks ran._")
    else:
        rows = [[c.get("level"), c.get("name"), c.get("status"), c.get("measured"), c.get("threshold"),
                 c.get("evidence")] for c in checks]
        lines += _table(["Level", "Check", "Status", "Measured", "Threshold", "Evidence"], rows)
    if notes:
        lines += ["", "### Failure notes", ""]
        rows = [[n.get("cause"), n.get("diagnosis"), n.get("fix"),
                 {True: "yes", False: "no"}.get(n.get("silent"), n.get("silent"))] for n in notes]
        lines += _table(["Cause", "Diagnosis", "Fix", "Silent"], rows)
    lines += ["", "<sub>Written by ladder from the migration's sealed journal; edits here are not read back.</sub>"]
    return "\n".join(lines) + "\n"
