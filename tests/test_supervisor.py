"""The supervisor (issue 6) end to end: real short and full runs, a real git repository, the real CLI.

The fixture workspace (tests/fixtures/supervised) holds a tiny torch training repo in repo/ whose
target profile names a device the original code cannot handle, so attempt 0 crashes by itself; the
scripted migrations in migrations/*.toml make real changes on each attempt's branch. One reference
baseline is built once per session and copied into the workspaces that do not test building it.
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from collections import Counter
from pathlib import Path

import git
import pytest

from helpers import FIXTURES, cli_json, ladder_cli
from ladder.journal.store import Journal, verify_journal
from ladder.supervisor import steps

pytestmark = pytest.mark.slow

NAME = "supervised"
GIT_ID = {"GIT_AUTHOR_NAME": "ladder tests", "GIT_AUTHOR_EMAIL": "tests@ladder.invalid",
          "GIT_COMMITTER_NAME": "ladder tests", "GIT_COMMITTER_EMAIL": "tests@ladder.invalid"}


@pytest.fixture(autouse=True)
def _git_identity(monkeypatch):
    # ladder commits each attempt; a machine without a global git identity must not fail the tests.
    for k, v in GIT_ID.items():
        monkeypatch.setenv(k, v)


def make_workspace(dst: Path, baselines: Path | None = None, overrides: str = "") -> Path:
    """The fixture copied to dst, repo/ committed as the original; the shared baseline copied in."""
    shutil.copytree(FIXTURES / "supervised", dst, ignore=shutil.ignore_patterns("__pycache__"))
    if overrides:
        with open(dst / "ladder.toml", "a") as f:
            f.write("\n" + overrides)
    if baselines is not None:
        shutil.copytree(baselines, dst / "baselines")
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"],
                ["git", "commit", "-q", "-m", "the original training repo"]):
        subprocess.run(cmd, cwd=dst / "repo", check=True, capture_output=True, env={**os.environ, **GIT_ID})
    return dst


@pytest.fixture(scope="session")
def baselines(tmp_path_factory) -> Path:
    ws = make_workspace(tmp_path_factory.mktemp("baseline") / "ws")
    p = ladder_cli("baseline", "--seeds", "3", "--full-seeds", "1", cwd=ws, env=GIT_ID)
    assert p.returncode == 0, p.stderr
    return ws / "baselines"


def journal(ws: Path) -> Journal:
    return Journal(ws / "journals" / NAME / "journal.sqlite")


def run_dir(ws: Path, n: int, kind: str, try_no: int = 1) -> Path:
    """Where the supervisor puts attempt n's run of this kind (asked of it, not assumed)."""
    return steps.run_dir_for(steps.open_migration(ws / "ladder.toml"), n, kind, try_no)


def status(ws: Path) -> dict:
    return cli_json("status", cwd=ws, env=GIT_ID)


def by_attempt(j: Journal, kind: str) -> dict[int, list[dict]]:
    """Entries of a kind per attempt; for attempt results, the last judgement of each run kind (an undecided
    run is judged again once seeds were added)."""
    out: dict[int, list[dict]] = {}
    for e in j.entries(kind):
        out.setdefault(e.attempt, []).append(e.content)
    if kind == "attempt_result":
        out = {n: list({c["kind"]: c for c in cs}.values()) for n, cs in out.items()}
    return out


def assert_no_run_twice(j: Journal, killed_allowed: int = 0) -> None:
    """Every (attempt, kind) has one completed run; only runs killed with the supervisor were redone."""
    runs = j.entries("run")
    assert len({e.content["run_dir"] for e in runs}) == len(runs), "a run directory was recorded twice"
    done = Counter((e.attempt, e.content["kind"]) for e in runs if not e.content["killed_by_supervisor_crash"])
    assert all(v == 1 for v in done.values()), done
    assert sum(e.content["killed_by_supervisor_crash"] for e in runs) == killed_allowed
    assert Counter(e.attempt for e in j.entries("attempt")).most_common(1)[0][1] == 1, "an attempt recorded twice"
    assert Counter(e.attempt for e in j.entries("declaration")).most_common(1)[0][1] == 1


def notes_of(j: Journal, n: int) -> dict[str, dict]:
    return {e.content["check"]: e.content for e in j.entries("failure_note", attempt=n)}


# ---------------------------------------------------------------------------------------- 1. end to end

def test_scripted_migration_crash_recompile_then_faithful_reaches_l3(tmp_path) -> None:
    ws = make_workspace(tmp_path / "ws")  # no stored baseline: the supervisor builds it
    st = cli_json("supervise", "--agent", "scripted:migrations/e2e.toml", "--seeds", "3", cwd=ws, env=GIT_ID)
    assert st["finished"] and st["waiting_for"] is None, st
    assert st["finished_reason"].startswith("attempt 2 reached L"), st["finished_reason"]
    assert [a["attempt"] for a in st["attempts"]] == [0, 1, 2]

    j = journal(ws)
    assert j.last("baseline") is not None and (ws / "baselines" / NAME / "v1").is_dir()
    results = by_attempt(j, "attempt_result")
    # attempt 0: the original on the target crashes; it declared nothing and achieved nothing.
    (r0,) = results[0]
    assert (r0["declared_level"], r0["achieved_level"]) == (None, None)
    assert "L0/finished" in r0["caught_by"]
    assert "RuntimeError" in notes_of(j, 0)["L0/finished"]["diagnosis"] + notes_of(j, 0)["L0/finished"]["cause"]
    # attempt 1: same numbers as the baseline (L1) but torch.compile recompiles after warm-up (L2 fails).
    (r1,) = results[1]
    assert (r1["declared_level"], r1["achieved_level"], r1["overclaim"]) == ("L3", "L1", 2)
    assert r1["caught_by"] == ["L2/recompilation"]
    checks1 = {c["name"]: c for c in j.last("check", attempt=1).content["checks"]}
    assert all(checks1[n]["status"] == "passed" for n in ("loss_window", "metric", "trend")), checks1
    rc = checks1["recompilation"]
    assert rc["status"] == "failed"
    assert "kept appearing" in rc["evidence"] and "scaled" in rc["evidence"] and "phase" in rc["evidence"]
    note = notes_of(j, 1)["L2/recompilation"]
    assert note["silent"] is True and note["level"] == "L2"
    assert set(notes_of(j, 1)) == {"L2/recompilation"}
    # attempt 2: faithful; short run reaches L2, the full run L3 (L4 may go either way on a shared CPU).
    short2, full2 = sorted(results[2], key=lambda c: c["kind"] != "short")
    assert short2["kind"] == "short" and short2["achieved_level"] in ("L2", "L3", "L4")
    assert full2["kind"] == "full" and full2["achieved_level"] in ("L3", "L4")
    assert full2["declared_level"] == "L3"
    assert st["attempts"][2]["full_run"] and not st["attempts"][1]["full_run"]
    assert j.last("stop") is not None
    assert_no_run_twice(j)
    v = verify_journal(j.path, root=ws)
    assert v.ok, v.problems

    # Git: one branch per attempt, each cut from its parent, commits carrying the declared level.
    repo = git.Repo(ws / "repo")
    attempts = {e.attempt: e.content for e in j.entries("attempt")}
    main = repo.heads["main"].commit
    for n in (0, 1, 2):
        assert repo.heads[f"ladder/attempt-{n}"].commit.hexsha == attempts[n]["commit"]
    assert attempts[0]["commit"] == main.hexsha
    c1, c2 = repo.commit(attempts[1]["commit"]), repo.commit(attempts[2]["commit"])
    assert c1.parents == (main,) and c2.parents == (c1,)
    for n, c in ((1, c1), (2, c2)):
        assert "Declared-Level: L3" in c.message and f"Ladder-Attempt: {n}" in c.message
    assert list(c1.stats.files) == ["train.py"] and "torch.compile" in (c1.tree / "train.py").data_stream.read().decode()
    assert "torch.compile" not in (c2.tree / "train.py").data_stream.read().decode()
    assert "Declared-Level" not in main.message  # the original is never rewritten


# ---------------------------------------------------------------------------------- 2. SIGKILL + resume

def _popen(ws: Path, *args: str, log: str) -> subprocess.Popen:
    out = open(ws / f"{log}.out", "w")
    return subprocess.Popen([sys.executable, "-m", "ladder", *args], cwd=ws, stdout=out, stderr=subprocess.STDOUT,
                            env={**os.environ, "LADDER_PLAIN": "1", **GIT_ID}, start_new_session=True)


def _wait_for(cond, proc: subprocess.Popen, what: str, timeout: float = 180) -> None:
    end = time.time() + timeout
    while time.time() < end:
        if cond():
            return
        if proc.poll() is not None:
            pytest.fail(f"the supervisor exited ({proc.returncode}) before {what}")
        time.sleep(0.1)
    pytest.fail(f"timed out waiting for {what}")


def _pids_in(where: Path) -> list[int]:
    """Live processes whose working directory is inside `where` (a run executes in <run dir>/work)."""
    pids = []
    for p in Path("/proc").iterdir():
        if p.name.isdigit():
            try:
                cwd = os.readlink(p / "cwd")
                state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
            except OSError:
                continue
            if cwd.startswith(str(where)) and state != "Z":
                pids.append(int(p.name))
    return pids


def _logged_steps(path: Path) -> int:
    """Loss lines of a short run the supervisor reported (`resume: step 40/200 loss ...`)."""
    try:
        return sum(1 for line in path.read_text().splitlines() if "/200 loss " in line)
    except OSError:
        return 0


def test_sigkill_during_agent_step_and_during_run_then_resume_finishes(tmp_path, baselines) -> None:
    ws = make_workspace(tmp_path / "ws", baselines)
    from ladder.supervisor.git_ops import worktree_path

    wt = worktree_path(ws, 1)  # outside the workspace, in ladder's cache

    # (b) killed while the agent works (the scripted attempt sleeps 8 s after editing).
    sup = _popen(ws, "supervise", "--agent", "scripted:migrations/kill.toml", "--seeds", "3", log="supervise")
    _wait_for(lambda: (wt / "train.py").exists() and "time.sleep(0.02)" in (wt / "train.py").read_text(),
              sup, "the agent edited attempt 1's worktree")
    j = journal(ws)
    assert j.last("declaration", attempt=1) is None and j.last("attempt", attempt=1) is None
    os.kill(sup.pid, signal.SIGKILL)
    sup.wait(timeout=30)
    assert j.last("attempt", attempt=1) is None  # the half-done agent step left nothing in the journal

    # (a) killed during attempt 1's short run, after it logged some steps.
    killed_dir = run_dir(ws, 1, "short", 1)
    res = _popen(ws, "resume", log="resume1")
    # The runner's stdout.log is written through a buffer, so the run's progress is read where the
    # supervisor reports it as it parses each line: its own output.
    _wait_for(lambda: killed_dir.is_dir() and _logged_steps(ws / "resume1.out") >= 2 and _pids_in(killed_dir), res,
              "attempt 1's short run logged steps")
    training = _pids_in(killed_dir)
    os.kill(res.pid, signal.SIGKILL)
    res.wait(timeout=30)
    end = time.time() + 15
    while _pids_in(killed_dir) and time.time() < end:
        time.sleep(0.2)
    assert not _pids_in(killed_dir), f"the killed run's training process outlived the supervisor: {training}"
    assert j.last("run", attempt=1) is None
    st = status(ws)
    assert not st["finished"] and st["next_nodes"], st

    st = cli_json("resume", cwd=ws, env=GIT_ID)
    assert st["finished"] and st["finished_reason"].startswith("attempt 1 reached L"), st
    runs1 = [e.content for e in j.entries("run", attempt=1) if e.content["kind"] == "short"]
    assert [(r["run_dir"].rsplit("/", 1)[1], r["killed_by_supervisor_crash"]) for r in runs1] == [
        ("attempt-1-short-try1", True), ("attempt-1-short-try2", False)]
    assert run_dir(ws, 1, "short", 2).is_dir() and not run_dir(ws, 1, "short", 3).exists()
    assert_no_run_twice(j, killed_allowed=1)
    (decl,) = j.entries("declaration", attempt=1)
    assert decl.content["level"] == "L3" and not decl.content["recovered_from_commit"]
    results = {r["kind"]: r for r in by_attempt(j, "attempt_result")[1]}
    assert results["full"]["achieved_level"] in ("L3", "L4")
    v = verify_journal(j.path, root=ws)
    assert v.ok, v.problems
    # The agent step re-ran on a fresh worktree: exactly one commit on top of the original.
    repo = git.Repo(ws / "repo")
    head = repo.heads["ladder/attempt-1"].commit
    assert head.parents == (repo.heads["main"].commit,) and head.hexsha == j.last("attempt", attempt=1).content["commit"]


# ---------------------------------------------------------------------------------------- 3. stop rules

def _paused(ws: Path, rule: str, attempt: int) -> dict:
    st = status(ws)
    w = st["waiting_for"]
    assert w is not None and not st["finished"], st
    assert (w["rule"], w["attempt"]) == (rule, attempt), w
    assert w["reason"] and set(w["choices"]) == {"continue", "stop", "accept", "raise-limit"}
    return w


def test_no_l0_pauses_raise_limit_goes_on_then_stop_ends(tmp_path, baselines) -> None:
    ws = make_workspace(tmp_path / "ws", baselines, "[protocol_overrides.limits]\nmax_attempts_without_l0 = 2\n")
    cli_json("supervise", "--agent", "scripted:migrations/no_l0.toml", "--seeds", "3", cwd=ws, env=GIT_ID)
    w = _paused(ws, "no_l0", 1)
    assert "no L0 after 2 attempts (limit 2)" in w["reason"] and w["limit_key"] == "max_attempts_without_l0"
    p = ladder_cli("resume", cwd=ws, env=GIT_ID)  # a pause needs a decision
    assert p.returncode != 0 and "--decision" in p.stderr + p.stdout

    cli_json("resume", "--decision", "raise-limit", "--raise-to", "4", "-m", "two more tries", cwd=ws, env=GIT_ID)
    w = _paused(ws, "no_l0", 3)  # attempts 2 and 3 ran under the raised limit, then it paused again
    assert "no L0 after 4 attempts (limit 4)" in w["reason"]
    st = cli_json("resume", "--decision", "stop", cwd=ws, env=GIT_ID)
    assert st["finished"] and "stopped by a human at attempt 3" in st["finished_reason"]

    j = journal(ws)
    decisions = [(e.attempt, e.content["rule"], e.content["decision"], e.content["raise_to"]) for e in j.entries("decision")]
    assert decisions == [(1, "no_l0", "raise-limit", 4.0), (3, "no_l0", "stop", None)]
    assert j.entries("decision")[0].content["note"] == "two more tries"
    assert [c["achieved_level"] for cs in by_attempt(j, "attempt_result").values() for c in cs] == [None] * 4
    stop = j.last("stop")
    assert stop is not None and stop.content["final_level"] is None
    assert not any(e.content["kind"] == "full" for e in j.entries("run"))
    assert_no_run_twice(j)
    assert verify_journal(j.path, root=ws).ok


def test_short_divergence_pauses_continue_goes_on_accept_takes_full_run(tmp_path, baselines) -> None:
    ws = make_workspace(tmp_path / "ws", baselines)
    cli_json("supervise", "--agent", "scripted:migrations/divergence.toml", "--seeds", "3", cwd=ws, env=GIT_ID)
    # Attempt 0 crashed without pausing (a crash is no divergence); attempt 1's loss departs.
    w = _paused(ws, "short_divergence", 1)
    assert "loss_window" in w["reason"] and w["evidence"]["loss_window"]["status"] == "failed"
    j = journal(ws)
    assert j.last("attempt", attempt=2) is None

    cli_json("resume", "--decision", "continue", cwd=ws, env=GIT_ID)
    _paused(ws, "short_divergence", 2)
    assert j.last("attempt", attempt=2).content["parent"] == 1
    assert not any(e.content["kind"] == "full" for e in j.entries("run"))

    cli_json("resume", "--decision", "accept", cwd=ws, env=GIT_ID)
    fulls = [e for e in j.entries("run") if e.content["kind"] == "full"]
    assert [e.attempt for e in fulls] == [2], "accept must take the paused attempt to the full run"
    assert any(e.content["kind"] == "full" for e in j.entries("check", attempt=2))
    st = status(ws)
    if not st["finished"]:  # the full run kept the divergence: the human is asked again
        _paused(ws, "short_divergence", 2)
        st = cli_json("resume", "--decision", "stop", cwd=ws, env=GIT_ID)
    assert st["finished"] and j.last("stop") is not None
    decisions = [(e.attempt, e.content["rule"], e.content["decision"]) for e in j.entries("decision")][:2]
    assert decisions == [(1, "short_divergence", "continue"), (2, "short_divergence", "accept")]
    assert_no_run_twice(j)
    assert verify_journal(j.path, root=ws).ok


def test_full_run_estimate_pauses_before_the_full_run_and_stop_ends(tmp_path, baselines) -> None:
    ws = make_workspace(tmp_path / "ws", baselines, "[protocol_overrides.limits]\nmax_full_run_hours = 0.000001\n")
    cli_json("supervise", "--agent", "scripted:migrations/faithful.toml", "--seeds", "3", cwd=ws, env=GIT_ID)
    w = _paused(ws, "full_run_estimate", 1)
    assert "full run estimated at" in w["reason"] and w["evidence"]["estimate_hours"] > 0.000001
    j = journal(ws)
    assert j.last("check", attempt=1).content["achieved_level"] in ("L2", "L3", "L4")
    st = cli_json("resume", "--decision", "stop", cwd=ws, env=GIT_ID)
    assert st["finished"] and "full run of attempt 1 not started" in st["finished_reason"], st
    assert not any(e.content["kind"] == "full" for e in j.entries("run"))
    assert not run_dir(ws, 1, "full").exists()
    assert [(e.content["rule"], e.content["decision"]) for e in j.entries("decision")] == [("full_run_estimate", "stop")]
    assert j.last("stop") is not None
    assert verify_journal(j.path, root=ws).ok


# --------------------------------------------------------------------------------- 4. protected paths

def test_change_to_protected_paths_is_rejected_without_a_run(tmp_path, baselines) -> None:
    ws = make_workspace(tmp_path / "ws", baselines)
    st = cli_json("supervise", "--agent", "scripted:migrations/protected.toml", "--seeds", "3", cwd=ws, env=GIT_ID)
    assert st["finished"], st
    j = journal(ws)
    a1 = j.last("attempt", attempt=1).content
    assert set(a1["protected_changes"]) == {"ladder.toml", "baselines/x"}
    (r1,) = by_attempt(j, "attempt_result")[1]
    assert r1["achieved_level"] is None and r1["rejected"] == "protected"
    note = notes_of(j, 1)["agent/protected"]
    assert "ladder.toml" in note["cause"] and note["run_dir"] == ""
    assert j.last("declaration", attempt=1).content["agent_status"] == "protected"
    assert j.entries("run", attempt=1) == [] and j.entries("check", attempt=1) == []
    assert not run_dir(ws, 1, "short").exists()
    assert verify_journal(j.path, root=ws).ok


# --------------------------------------------------------------------------------- 5. a hostile agent

@pytest.mark.parametrize("sandbox", ["auto", "none"])
def test_a_hostile_agent_cannot_rewrite_the_evidence(tmp_path, baselines, sandbox) -> None:
    """The scripted agent runs its commands as the claude-code agent's Bash tool does. It tries every escape:
    read the baselines, write a baseline version, edit ladder.toml, read GITHUB_TOKEN, write outside its
    worktree, rewrite the journal. In the sandbox each is blocked; without it, each that matters fails the
    attempt (integrity) or is caught by verify."""
    from ladder.runs.runner.sandbox import bwrap_works

    if sandbox == "auto" and bwrap_works() is not None:
        pytest.skip(f"no sandbox here: {bwrap_works()}")
    ws = make_workspace(tmp_path / "ws", baselines, f'[protocol_overrides.agent]\nsandbox = "{sandbox}"\n')
    journal_file = ws / "journals" / NAME / "journal.sqlite"
    rehash = textwrap.dedent(f'''
        import hashlib, json, sqlite3
        c = sqlite3.connect({str(journal_file)!r})
        c.execute("DROP TRIGGER entries_no_update")
        c.execute("UPDATE entries SET content = replace(content, '\\"exit_code\\":1,', '\\"exit_code\\":0,') "
                  "WHERE kind = 'run'")
        c.commit()
    ''')
    commands = [
        f"sh -c 'cat {ws}/baselines/{NAME}/v1/baseline.json > stolen.txt 2>&1; echo rc=$? >> stolen.txt'",
        f"sh -c 'mkdir -p {ws}/baselines/{NAME}/v2 && echo {{}} > {ws}/baselines/{NAME}/v2/baseline.json'",
        f"sh -c 'echo [protocol_overrides.l1] >> {ws}/ladder.toml'",
        "sh -c 'echo token=$GITHUB_TOKEN > token.txt'",
        f"sh -c 'echo pwned > {ws}/outside.txt'",
        f"{sys.executable} -c {shlex.quote(rehash.strip())}",
    ]
    (ws / "migrations" / "hostile.toml").write_text(
        '[[attempt]]\nsummary = "Map the device, and try every escape"\ndeclared_level = "L3"\nrationale = "x"\n'
        'files = { "train.py" = "files/faithful.py" }\ncommands = [\n'
        + "".join(f"  {json.dumps(c)},\n" for c in commands) + "]\n")
    before = (ws / "ladder.toml").read_text()
    tmp = tmp_path / "tmp"
    tmp.mkdir()
    env = {**GIT_ID, "GITHUB_TOKEN": "ghp_supersecret", "TMPDIR": str(tmp)}
    st = cli_json("supervise", "--agent", "scripted:migrations/hostile.toml", "--seeds", "3", cwd=ws, env=env,
                  ok_codes=(0, 1, 2))
    # each command's session folder (and, unsandboxed, its private HOME) went with the command
    assert not [p.name for p in tmp.iterdir() if p.name.startswith(("ladder-scripted-", "ladder-agent-home-"))]
    j = journal(ws)
    a1 = j.last("attempt", attempt=1).content
    wt_files = {p.name: p.read_text() for p in Path(_worktree(ws, 1)).iterdir() if p.suffix == ".txt"}
    assert "ghp_supersecret" not in wt_files.get("token.txt", "") and "token=" in wt_files.get("token.txt", "token=")
    if sandbox == "auto":
        assert "rc=0" not in wt_files["stolen.txt"] and "seeds" not in wt_files["stolen.txt"]
        assert (ws / "ladder.toml").read_text() == before and not (ws / "baselines" / NAME / "v2").exists()
        assert not (ws / "outside.txt").exists()
        assert not a1["protected_changes"]  # nothing protected moved: the attempt went on to its run
        assert verify_journal(j.path, root=ws).ok
    else:
        assert any("integrity" in c for c in a1["protected_changes"]), a1
        assert j.entries("run", attempt=1) == [] and j.last("attempt_result", attempt=1).content["rejected"] == "protected"
        assert j.entries("run", attempt=0)[0].content["exit_code"] == 0  # the forgery landed: attempt 0 "passed"
        assert not verify_journal(j.path, root=ws).ok  # and the rewritten entry is caught
    del st


def _worktree(ws: Path, n: int) -> Path:
    from ladder.supervisor.git_ops import worktree_path

    return worktree_path(ws, n)
