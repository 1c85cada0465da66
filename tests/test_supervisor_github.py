"""The pull-request path of the supervisor: one PR per attempt, pushed to a real (bare) git remote,
opened and then updated with the results through PyGithub against a local fake of GitHub's REST API."""

from __future__ import annotations

import subprocess
from pathlib import Path

import git
import pytest

from helpers import ladder_cli
from ladder.journal.store import Journal
from test_github_pr import OWNER, NAME as REPO_NAME, TOKEN, github  # noqa: F401  (fixture)
from test_supervisor import GIT_ID, NAME, baselines, make_workspace  # noqa: F401  (fixture)


@pytest.mark.slow
def test_each_attempt_gets_a_pull_request_updated_with_its_results(tmp_path: Path, github, baselines) -> None:  # noqa: F811
    remote = tmp_path / "remote.git"
    subprocess.run(["git", "init", "-q", "--bare", "-b", "main", str(remote)], check=True)
    ws = make_workspace(tmp_path / "ws", baselines,
                        overrides=f'[github]\nrepo = "{OWNER}/{REPO_NAME}"\napi_url = "{github.url}"\n')
    repo = git.Repo(ws / "repo")
    repo.create_remote("origin", str(remote))
    repo.git.push("origin", "main")

    p = ladder_cli("supervise", "--agent", "scripted:migrations/e2e.toml", "--json", cwd=ws,
                   env={**GIT_ID, "GITHUB_TOKEN": TOKEN}, timeout=900)
    assert p.returncode == 0, p.stderr[-3000:]

    with Journal(ws / "journals" / NAME / "journal.sqlite") as j:
        attempts = {e.attempt: e.content for e in j.entries("attempt") if e.attempt > 0}
        results = {e.attempt: e.content for e in j.entries("attempt_result")}
    assert {n: a["pull_request"] for n, a in attempts.items()} == {1: 1, 2: 2}

    # the branches really arrived in the remote, at the commits the journal recorded
    bare = git.Repo(remote)
    for n, a in attempts.items():
        assert bare.commit(f"ladder/attempt-{n}").hexsha == a["commit"]

    opened = [r for r in github.requests if r["method"] == "POST" and r["path"].endswith("/pulls")]
    assert [r["body"]["head"] for r in opened] == ["ladder/attempt-1", "ladder/attempt-2"]
    assert all(r["auth"] and TOKEN in r["auth"] for r in opened)
    assert "Declared level (sealed before checks) | L3" in opened[0]["body"]["body"]
    assert "Not run yet" in opened[0]["body"]["body"]

    # after the checks each PR carries its achieved level, the check table and the notes
    pr1 = github.pulls[1]["body"]
    assert f"Achieved level | {results[1]['achieved_level']}" in pr1
    assert "recompilation" in pr1 and "Failure notes" in pr1
    assert github.labels[1] == [f"ladder:{results[1]['achieved_level']}"]
    # attempt 2 was checked twice (short, then full): its PR shows the full run's level last
    assert github.labels[2][-1] == f"ladder:{results[2]['achieved_level']}"
    assert "main_result" in github.pulls[2]["body"]
