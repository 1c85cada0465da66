"""The PR path against a local stand-in for GitHub's REST API, with a real push to a bare repository.

FakeGitHub answers the endpoints PyGithub calls (GET repo, GET/POST pulls, GET/PATCH one pull,
POST issue labels) from 127.0.0.1 and records every request, so the tests assert what ladder
actually sent. The git remote is a local `git init --bare` repository.
"""

from __future__ import annotations

import json
import subprocess
import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlsplit

import pytest

from ladder._util.errors import LadderError
from ladder.supervisor.github_pr import PullRequests, pull_requests_from_env, render_pr_body

OWNER, NAME = "acme", "port"
TOKEN = "ghp_test_token_not_real"


class FakeGitHub:
    def __init__(self) -> None:
        self.requests: list[dict[str, Any]] = []
        self.pulls: dict[int, dict[str, Any]] = {}
        self.labels: dict[int, list[str]] = {}
        fake = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: Any) -> None:
                pass

            def _reply(self, status: int, payload: Any) -> None:
                data = json.dumps(payload).encode()
                self.send_response(status)
                self.send_header("Content-Type", "application/json; charset=utf-8")
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def _handle(self) -> None:
                url = urlsplit(self.path)
                length = int(self.headers.get("Content-Length") or 0)
                body = json.loads(self.rfile.read(length)) if length else None
                fake.requests.append({"method": self.command, "path": url.path, "query": parse_qs(url.query),
                                      "body": body, "auth": self.headers.get("Authorization")})
                status, payload = fake.route(self.command, url.path, parse_qs(url.query), body)
                self._reply(status, payload)

            do_GET = do_POST = do_PATCH = do_PUT = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def repo_json(self) -> dict[str, Any]:
        return {"id": 1, "name": NAME, "full_name": f"{OWNER}/{NAME}", "owner": {"login": OWNER, "id": 2},
                "url": f"{self.url}/repos/{OWNER}/{NAME}", "default_branch": "main", "private": True}

    def pull_json(self, number: int) -> dict[str, Any]:
        pr = self.pulls[number]
        return {"id": 100 + number, "number": number, "state": pr["state"], "title": pr["title"], "body": pr["body"],
                "url": f"{self.url}/repos/{OWNER}/{NAME}/pulls/{number}",
                "issue_url": f"{self.url}/repos/{OWNER}/{NAME}/issues/{number}",
                "html_url": f"https://github.example/{OWNER}/{NAME}/pull/{number}",
                "head": {"ref": pr["head"], "label": f"{OWNER}:{pr['head']}"}, "base": {"ref": pr["base"]}}

    def route(self, method: str, path: str, query: dict, body: Any) -> tuple[int, Any]:
        repo = f"/repos/{OWNER}/{NAME}"
        if path == repo and method == "GET":
            return 200, self.repo_json()
        if path == f"{repo}/pulls" and method == "GET":
            head, state = query.get("head", [None])[0], query.get("state", ["open"])[0]
            hits = [n for n, p in self.pulls.items()
                    if (head is None or f"{OWNER}:{p['head']}" == head) and (state == "all" or p["state"] == state)]
            return 200, [self.pull_json(n) for n in hits]
        if path == f"{repo}/pulls" and method == "POST":
            number = len(self.pulls) + 1
            self.pulls[number] = {"state": "open", **{k: body[k] for k in ("title", "body", "head", "base")}}
            return 201, self.pull_json(number)
        if path.startswith(f"{repo}/pulls/"):
            number = int(path.rsplit("/", 1)[1])
            if number not in self.pulls:
                return 404, {"message": "Not Found"}
            if method == "PATCH":
                self.pulls[number].update({k: v for k, v in body.items() if k in ("title", "body", "state")})
            return 200, self.pull_json(number)
        if path.startswith(f"{repo}/issues/") and path.endswith("/labels") and method == "POST":
            number = int(path.split("/")[-2])
            self.labels.setdefault(number, []).extend(body["labels"] if isinstance(body, dict) else body)
            return 200, [{"name": n, "url": f"{self.url}{repo}/labels/{n}"} for n in self.labels[number]]
        return 404, {"message": f"no route for {method} {path}"}


@pytest.fixture
def github() -> Iterator[FakeGitHub]:
    fake = FakeGitHub()
    fake.thread.start()
    yield fake
    fake.server.shutdown()
    fake.server.server_close()


def _git(*args: str, cwd: Path) -> str:
    return subprocess.run(["git", "-c", "user.name=t", "-c", "user.email=t@t", *args], cwd=cwd, check=True,
                          capture_output=True, text=True).stdout.strip()


@pytest.fixture
def port_repo(tmp_path: Path) -> tuple[Path, Path, Path]:
    """(repository, attempt-1 worktree, bare remote); main is pushed, ladder/attempt-1 holds a commit."""
    remote = tmp_path / "remote.git"
    _git("init", "-q", "--bare", "-b", "main", str(remote), cwd=tmp_path)
    repo = tmp_path / "port"
    repo.mkdir()
    _git("init", "-q", "-b", "main", cwd=repo)
    (repo / "train.py").write_text("device = 'cuda'\n")
    _git("add", ".", cwd=repo)
    _git("commit", "-qm", "original", cwd=repo)
    _git("remote", "add", "origin", str(remote), cwd=repo)
    _git("push", "-q", "origin", "main", cwd=repo)
    worktree = tmp_path / "attempt-1"
    _git("worktree", "add", "-q", "-b", "ladder/attempt-1", str(worktree), cwd=repo)
    (worktree / "train.py").write_text("device = xm.xla_device()\n")
    _git("commit", "-qam", "attempt 1: declared L1", cwd=worktree)
    return repo, worktree, remote


ATTEMPT = {"attempt": 1, "parent": 0, "summary": "Use the XLA device.", "declared_level": "L1",
           "rationale": "The crash was the device | nothing else checked.", "branch": "ladder/attempt-1"}
CHECKS = [
    {"level": "L0", "name": "finished", "status": "passed", "measured": 0.8712, "threshold": None, "evidence": ""},
    {"level": "L2", "name": "recompilation", "status": "failed", "measured": 199, "threshold": 5,
     "evidence": "CompileTime count grew every step\nafter warm-up"},
]
NOTES = [{"cause": "mask shape varies per batch", "diagnosis": "199 compilations", "fix": "pad to max length",
          "silent": True}]


def test_open_pushes_the_branch_and_creates_the_pr(github: FakeGitHub, port_repo) -> None:
    _, worktree, remote = port_repo
    prs = PullRequests(f"{OWNER}/{NAME}", TOKEN, base_url=github.url)
    body = render_pr_body(ATTEMPT)

    number = prs.open_for_attempt(worktree, "ladder/attempt-1", "main", "attempt 1: Use the XLA device", body)

    assert number == 1
    # The push was real: the bare remote holds the attempt's commit under the same branch name.
    assert _git("rev-parse", "ladder/attempt-1", cwd=remote) == _git("rev-parse", "HEAD", cwd=worktree)
    posts = [r for r in github.requests if r["method"] == "POST"]
    assert len(posts) == 1 and posts[0]["path"] == f"/repos/{OWNER}/{NAME}/pulls"
    assert {k: posts[0]["body"][k] for k in ("head", "base", "title")} == {
        "head": "ladder/attempt-1", "base": "main", "title": "attempt 1: Use the XLA device"}
    assert posts[0]["body"]["body"] == body and "| Declared level (sealed before checks) | L1 |" in body
    assert all(r["auth"] == f"token {TOKEN}" for r in github.requests)
    lookup = [r for r in github.requests if r["method"] == "GET" and r["path"].endswith("/pulls")]
    assert lookup[0]["query"]["head"] == [f"{OWNER}:ladder/attempt-1"]


def test_open_is_idempotent(github: FakeGitHub, port_repo) -> None:
    _, worktree, _ = port_repo
    prs = PullRequests(f"{OWNER}/{NAME}", TOKEN, base_url=github.url)
    first = prs.open_for_attempt(worktree, "ladder/attempt-1", "main", "t", "b")

    again = prs.open_for_attempt(worktree, "ladder/attempt-1", "main", "t", "b")

    assert again == first and len(github.pulls) == 1
    assert sum(r["method"] == "POST" and r["path"].endswith("/pulls") for r in github.requests) == 1


def test_update_writes_results_and_labels(github: FakeGitHub, port_repo) -> None:
    _, worktree, _ = port_repo
    prs = PullRequests(f"{OWNER}/{NAME}", TOKEN, base_url=github.url)
    number = prs.open_for_attempt(worktree, "ladder/attempt-1", "main", "t", render_pr_body(ATTEMPT))
    body = render_pr_body({**ATTEMPT, "achieved_level": "L1"}, CHECKS, NOTES)

    prs.update(number, body, labels=["declared:L1", "achieved:L1"])

    patch = [r for r in github.requests if r["method"] == "PATCH"]
    assert patch[0]["path"] == f"/repos/{OWNER}/{NAME}/pulls/{number}" and patch[0]["body"] == {"body": body}
    assert github.pulls[number]["body"] == body
    assert github.labels[number] == ["declared:L1", "achieved:L1"]
    assert "| L2 | recompilation | failed | 199 | 5 | CompileTime count grew every step<br>after warm-up |" in body
    assert "| mask shape varies per batch | 199 compilations | pad to max length | yes |" in body
    assert "| Achieved level | L1 |" in body and "> The crash was the device | nothing else checked." in body


def test_rejected_push_is_a_clear_error(github: FakeGitHub, port_repo) -> None:
    repo, worktree, remote = port_repo
    PullRequests(f"{OWNER}/{NAME}", TOKEN, base_url=github.url).push(worktree, "ladder/attempt-1")
    # Someone else moves the remote branch: ladder's push is no longer a fast-forward.
    other = remote.parent / "other"
    _git("clone", "-q", "-b", "ladder/attempt-1", str(remote), str(other), cwd=remote.parent)
    (other / "x.txt").write_text("x")
    _git("add", ".", cwd=other)
    _git("commit", "-qm", "foreign", cwd=other)
    _git("push", "-q", "origin", "ladder/attempt-1", cwd=other)
    (worktree / "train.py").write_text("device = 'xla'\n")
    _git("commit", "-qam", "amended attempt", cwd=worktree)

    with pytest.raises(LadderError, match="pushing ladder/attempt-1 to origin"):
        PullRequests(f"{OWNER}/{NAME}", TOKEN, base_url=github.url).open_for_attempt(
            worktree, "ladder/attempt-1", "main", "t", "b")
    assert not github.pulls


def test_github_error_is_a_clear_error(github: FakeGitHub, port_repo) -> None:
    _, worktree, _ = port_repo
    prs = PullRequests(f"{OWNER}/other", TOKEN, base_url=github.url)
    with pytest.raises(LadderError, match="HTTP 404"):
        prs.open_for_attempt(worktree, "ladder/attempt-1", "main", "t", "b")


def test_from_env(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("GITHUB_TOKEN", raising=False)
    assert pull_requests_from_env(f"{OWNER}/{NAME}", None) is None
    monkeypatch.setenv("GITHUB_TOKEN", TOKEN)
    assert pull_requests_from_env(None, None) is None
    prs = pull_requests_from_env(f"{OWNER}/{NAME}", "http://127.0.0.1:9")
    assert isinstance(prs, PullRequests) and prs.repo_full_name == f"{OWNER}/{NAME}"


def test_body_before_checks_says_pending() -> None:
    body = render_pr_body(ATTEMPT)
    assert "| Achieved level | pending |" in body and "Not run yet" in body and "Failure notes" not in body
