"""Nothing can rewrite the evidence: one writer per workspace, sandboxed runs, no orphans, honest data.

Each test reproduces an attack or an accident with real processes, real SQLite and real git: two writers at
once, a run that edits the rules or reads the user's home, a kill -9 mid-run, a journal cut or re-hashed,
NaN everywhere. Sandbox tests skip with a message where the kernel forbids bubblewrap's namespaces.
"""

from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import cli_json, ladder_cli, workspace
from ladder.runs.runner.sandbox import bwrap_works
from ladder.runs.runner.tree import _stat

NO_BWRAP = bwrap_works()
needs_bwrap = pytest.mark.skipif(NO_BWRAP is not None, reason=f"no sandbox here: {NO_BWRAP}")


def _with_program(ws: Path, code: str, sandbox: str = "auto") -> None:
    """Replace the tiny workspace's program and point both profiles at it."""
    (ws / "train.py").write_text(textwrap.dedent(code))
    text = (ws / "ladder.toml").read_text()
    text = text.replace('[profiles.reference]\n', f'[profiles.reference]\nsandbox = "{sandbox}"\n')
    (ws / "ladder.toml").write_text(text)


def _alive(pid: int) -> bool:
    return _stat(pid) is not None


# ---------------------------------------------------------------- one writer per workspace

@pytest.mark.slow
def test_a_second_writer_is_refused_with_who_holds_the_workspace(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    first = subprocess.Popen([sys.executable, "-m", "ladder", "baseline", "--seeds", "3", "--short-only"], cwd=ws,
                             env={**os.environ, "LADDER_PLAIN": "1"}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                             text=True)
    try:
        deadline = time.time() + 120
        while not (ws / ".ladder" / "lock.json").exists() and time.time() < deadline:
            time.sleep(0.1)
        second = ladder_cli("baseline", "--seeds", "3", "--short-only", cwd=ws)
        assert second.returncode == 2 and "workspace busy" in second.stderr and str(first.pid) in second.stderr
        assert "ladder baseline" in second.stderr and "Traceback" not in second.stderr
        reader = ladder_cli("baseline", "verify", cwd=ws)  # readers never wait
        assert reader.returncode == 2 and "no baseline to verify" in reader.stderr
    finally:
        out, err = first.communicate(timeout=600)
    assert first.returncode == 0, err
    assert cli_json("baseline", "verify", cwd=ws)["ok"] is True
    assert not list((ws / "baselines" / "tiny").glob(".*partial"))


# ---------------------------------------------------------------- the run cannot touch the rules

HOSTILE_RUN = """
    import json, os, sys
    from pathlib import Path
    run_dir = Path(os.environ["LADDER_RUN_DIR"])
    ws = run_dir.parents[2]  # runs/<name>/<run>: the workspace
    found = {}
    for target, text in ((ws / "ladder.toml", "\\n[protocol_overrides.l1]\\nloss_rel_tol = 100.0\\n"),
                         (ws / "baselines" / "tiny" / "v9" / "baseline.json", "{}")):
        try:
            target.parent.mkdir(parents=True, exist_ok=True)
            with open(target, "a") as f:
                f.write(text)
            found[str(target)] = "written"
        except OSError as e:
            found[str(target)] = type(e).__name__
    home = Path.home()
    found["home_ssh"] = (home / ".ssh").exists()
    found["home"] = str(home)
    print("facts", json.dumps(found), flush=True)
    for step in range(1, 11):
        print(f"step {step} loss {1.0 / step}", flush=True)
    print("metric acc=0.5", flush=True)
"""


@needs_bwrap
@pytest.mark.slow
def test_a_sandboxed_run_sees_neither_the_workspace_nor_the_home(tmp_path: Path, monkeypatch) -> None:
    home = tmp_path / "home"
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("PRIVATE KEY")
    monkeypatch.setenv("HOME", str(home))
    ws = workspace(tmp_path)
    _with_program(ws, HOSTILE_RUN, sandbox="bwrap")
    before = (ws / "ladder.toml").read_text()
    out = cli_json("run", "--on", "reference", cwd=ws, env={"HOME": str(home)})
    rec = json.loads((Path(out["run_dir"]) / "run.json").read_text())
    facts = json.loads(next(line for line in rec["first_lines"] if line.startswith("facts ")).split(" ", 1)[1])
    assert (ws / "ladder.toml").read_text() == before and not (ws / "baselines").exists()
    assert facts["home_ssh"] is False and facts["home"] != str(home)
    assert rec["sandbox"] == "bwrap" and rec["integrity"] == []


@pytest.mark.slow
def test_an_unsandboxed_run_that_edits_the_rules_fails_its_integrity_check(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    _with_program(ws, HOSTILE_RUN, sandbox="none")
    out = cli_json("run", "--on", "reference", cwd=ws)
    rec = json.loads((Path(out["run_dir"]) / "run.json").read_text())
    assert any("ladder.toml" in c for c in rec["integrity"]) and any("v9" in c for c in rec["integrity"])
    assert any("sandbox = \"none\"" in n for n in rec["notes"])
    refused = ladder_cli("check", out["run_dir"], cwd=ws)  # the planted baseline version is refused outright
    assert refused.returncode == 2 and "v9" in refused.stderr
    import shutil

    shutil.rmtree(ws / "baselines")
    res = ladder_cli("check", out["run_dir"], "--json", "--spec", str(ws / "ladder.toml"), cwd=ws)
    integrity = next(c for c in json.loads(res.stdout)["checks"] if c["name"] == "integrity")
    assert integrity["status"] == "failed" and "ladder.toml" in integrity["evidence"] and res.returncode == 1


# ---------------------------------------------------------------- no orphans

ORPHAN_MAKER = """
    import os, subprocess, sys, time
    child = subprocess.Popen([sys.executable, "-c", "import os, time; os.setsid(); time.sleep(600)"])
    print("child", child.pid, flush=True)
    for step in range(1, 4):
        print(f"step {step} loss 1.0", flush=True)
    time.sleep(600)
"""


def _child_pid(run_dir: Path, timeout: float = 120) -> int:
    deadline = time.time() + timeout
    while time.time() < deadline:
        log = run_dir / "stdout.log"
        if log.exists():
            for line in log.read_text().splitlines():
                if "\tchild " in line:
                    return int(line.split()[-1])
        time.sleep(0.1)
    raise AssertionError("the program never printed its child's pid")


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["none", pytest.param("bwrap", marks=needs_bwrap)])
def test_timeout_kills_children_that_left_the_process_group(tmp_path: Path, sandbox: str) -> None:
    ws = workspace(tmp_path)
    _with_program(ws, ORPHAN_MAKER, sandbox=sandbox)
    text = (ws / "ladder.toml").read_text().replace('source = "."', 'source = "."\ntimeout_minutes = 0.3')
    (ws / "ladder.toml").write_text(text)
    out = cli_json("run", "--on", "reference", "--run-dir", str(tmp_path / "r"), cwd=ws)
    rec = json.loads((tmp_path / "r" / "run.json").read_text())
    assert rec["timed_out"] is True and out["exit_code"] is not None
    pids = [p for p, _ in json.loads((tmp_path / "r" / "pids.json").read_text())["pids"]]
    assert len(pids) >= 2 and not any(_alive(p) for p in pids), "a descendant outlived the timeout"


@pytest.mark.slow
@pytest.mark.parametrize("sandbox", ["none", pytest.param("bwrap", marks=needs_bwrap)])
def test_kill_9_of_ladder_leaves_no_run_behind_after_resume(tmp_path: Path, sandbox: str) -> None:
    """SIGKILL of ladder mid-run: under bubblewrap the run's PID namespace dies with it; without, the direct
    child dies with its parent and the setsid grandchild is killed from pids.json by `kill_recorded`, which
    `ladder resume` calls before anything else."""
    from ladder.runs.runner.tree import kill_recorded

    ws = workspace(tmp_path)
    _with_program(ws, ORPHAN_MAKER, sandbox=sandbox)
    proc = subprocess.Popen([sys.executable, "-m", "ladder", "run", "--on", "reference", "--run-dir",
                             str(tmp_path / "r")], cwd=ws, env={**os.environ, "LADDER_PLAIN": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    _child_pid(tmp_path / "r")  # the program and its setsid child are up
    time.sleep(1.0)  # the watcher records them (host pids) in pids.json
    pids = [p for p, _ in json.loads((tmp_path / "r" / "pids.json").read_text())["pids"]]
    assert len(pids) >= 2  # the program (run directly, no shell) and its setsid child
    proc.kill()
    proc.wait()
    time.sleep(1.0)
    if sandbox == "bwrap":
        assert not any(_alive(p) for p in pids), "the sandbox's processes outlived ladder"
    else:
        assert any(_alive(p) for p in pids)  # the setsid grandchild survives a kill -9 of ladder ...
    kill_recorded(tmp_path / "r")  # ... until resume kills what the dead run recorded
    time.sleep(0.5)
    assert not any(_alive(p) for p in pids)


@pytest.mark.slow
def test_sigterm_to_ladder_takes_the_run_down(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    _with_program(ws, ORPHAN_MAKER, sandbox="none")
    proc = subprocess.Popen([sys.executable, "-m", "ladder", "run", "--on", "reference", "--run-dir",
                             str(tmp_path / "r")], cwd=ws, env={**os.environ, "LADDER_PLAIN": "1"},
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    child = _child_pid(tmp_path / "r")
    time.sleep(0.5)
    proc.send_signal(signal.SIGTERM)
    proc.wait(timeout=60)
    time.sleep(1.0)
    assert proc.returncode == 130 and not _alive(child)


# ---------------------------------------------------------------- symbolic links

def test_links_inside_the_source_stay_valid_and_links_leaving_it_are_refused(tmp_path: Path) -> None:
    from ladder._util.errors import LadderError
    from ladder.runs.execute import copy_source

    src, shared = tmp_path / "repo", tmp_path / "shared_data"
    (src / "data").mkdir(parents=True)
    shared.mkdir()
    (src / "data" / "a.txt").write_text("a")
    (shared / "big.bin").write_text("b")
    (src / "alias").symlink_to("data")
    (src / "absolute_inside").symlink_to(src / "data" / "a.txt")
    copy = tmp_path / "copy"
    copy_source(src, copy, [], [])
    assert (copy / "alias" / "a.txt").read_text() == "a" and (copy / "absolute_inside").resolve() == (copy / "data" / "a.txt")
    (src / "external").symlink_to("../shared_data")
    with pytest.raises(LadderError, match="links that leave it: external"):
        copy_source(src, copy, [], [])
    notes = copy_source(src, copy, [], [shared.resolve()])  # mounted: kept, pointing at the mount
    assert (copy / "external" / "big.bin").read_text() == "b" and "external" in notes[0]


# ---------------------------------------------------------------- secrets

def test_credentials_in_urls_and_secret_names_are_scrubbed_ca_bundles_kept() -> None:
    from ladder.runs.runner.scrub import scrubbed_env

    parent = {"DATABASE_URL": "postgres://user:pw@db:5432/x", "HTTPS_PROXY": "http://u:p@proxy:3128",
              "SENTRY_DSN": "https://key@sentry.io/1", "DB_PASS": "x", "PGPASS": "x", "STRIPE_SK": "sk_live_x",
              "AWS_CA_BUNDLE": "/etc/ssl/ca.pem", "REQUESTS_CA_BUNDLE": "/etc/ssl/ca.pem", "SSL_CERT_FILE": "/etc/x",
              "HTTP_PROXY": "http://proxy:3128", "PATH": "/usr/bin", "PWD": "/work"}
    env, removed = scrubbed_env(parent)
    assert set(removed) == {"DATABASE_URL", "HTTPS_PROXY", "SENTRY_DSN", "DB_PASS", "PGPASS", "STRIPE_SK"}
    assert {"AWS_CA_BUNDLE", "REQUESTS_CA_BUNDLE", "SSL_CERT_FILE", "HTTP_PROXY", "PATH", "PWD"} <= set(env)


# ---------------------------------------------------------------- non-finite values are evidence, never a crash

FUZZ = ["nan", "inf", "-inf", "-0", "1e400", "-1e400", "1e-400", "12abc", "", "0x10", "NaN", "1_000", "9" * 400,
        "+inf", "1.5", "--1", "-nan"]


def test_non_finite_and_malformed_numbers_in_every_parsed_field(tmp_path: Path) -> None:
    from ladder.checks import CheckContext, run_ladder
    from ladder.migration.protocol import load_protocol
    from ladder.migration.spec import ParseSpec
    from ladder.runs.parse import OutputParser
    from ladder.runs.records import Provenance, RunRecord

    spec = ParseSpec(loss=r"step (?P<step>\S+) loss (?P<loss>\S+)", metric=r"metric=(?P<value>\S+)",
                     direction="max", eval=r"eval step (?P<step>\S+) items (?P<items>\S+) loss (?P<loss>\S+)")
    p = OutputParser(spec)
    for i, v in enumerate(FUZZ):
        for line in (f"step {v} loss {v}", f"step {i + 1} loss {v}", f"eval step {v} items {v} loss {v}", f"metric={v}"):
            p.feed(line, 0.1 * i)
    rec = RunRecord(run_id="fuzz", kind="short", profile="p", platform="cpu", seed=0, command="x", cwd=".",
                    started_at=0.0, ended_at=2.0, exit_code=0, timeout_s=60, loss_curve=p.curve,
                    nonfinite_losses=p.nonfinite, evals=p.evals, metric=p.metric, metric_name="acc",
                    provenance=Provenance(source="."))
    rec.save(tmp_path)
    back = RunRecord.load(tmp_path)  # NaN and inf survive the round trip as evidence
    assert any(e.values.get("loss") != e.values.get("loss") for e in back.evals)
    assert back.metric != back.metric  # the last metric line was "-nan"
    assert p.unreadable > 0 and all(isinstance(pt.step, int) for pt in back.loss_curve)
    result = run_ladder(CheckContext(run=back, protocol=load_protocol(), baseline=None, expected_platform="cpu"))
    by = {(c.level, c.name): c for c in result.checks}
    assert by[("L0", "metric_reported")].status == "failed" and "not a finite number" in by[("L0", "metric_reported")].evidence
    assert by[("L0", "finite_loss")].status == "failed" and result.achieved_level is None


# ---------------------------------------------------------------- the CLI

def test_usage_errors_are_one_line_and_exit_2(tmp_path: Path) -> None:
    for args in (["run"], ["check"], ["bogus-cmd"], ["check", "x", "--require", "L9"]):
        p = ladder_cli(*args, cwd=tmp_path)
        assert p.returncode == 2, (args, p.stderr)
        assert "Traceback" not in p.stderr and len(p.stderr.strip().splitlines()) <= 2, p.stderr
    # ladder's own option after a command: the error says where it goes
    p = ladder_cli("init", str(tmp_path / "x"), "--plain", cwd=tmp_path)
    assert p.returncode == 2 and "--plain is an option of ladder itself" in p.stderr and "--plain init" in p.stderr


@pytest.mark.slow
def test_check_require_gates_on_the_level(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    cli_json("baseline", "--seeds", "3", "--short-only", cwd=ws)
    run = cli_json("run", "--on", "target", "--seed", "0", cwd=ws)
    ok = ladder_cli("check", run["run_dir"], "--require", "L1", cwd=ws)
    assert ok.returncode == 0, ok.stderr
    high = ladder_cli("check", run["run_dir"], "--require", "L3", cwd=ws)  # no full run: L3 not reached
    assert high.returncode == 1 and "below the required L3" in high.stderr


# ---------------------------------------------------------------- the journal: anchored, and keyed on request

def _journal_with_anchored_commits(tmp_path: Path, n_attempts: int = 4):
    """A real journal and a real git repo whose attempt commits carry the journal head, as the supervisor
    writes them: attempt entries, declarations, checks."""
    import git

    from ladder.journal import entries as je
    from ladder.journal.store import Journal
    from ladder.supervisor import git_ops

    repo_dir = tmp_path / "repo"
    repo_dir.mkdir(parents=True)
    repo = git.Repo.init(repo_dir, initial_branch="main")
    (repo_dir / "train.py").write_text("print('hi')\n")
    repo.git.add("-A")
    repo.git.execute(["git", "-c", "user.name=t", "-c", "user.email=t@t", "commit", "-qm", "original"])
    j = Journal(tmp_path / "journal.sqlite")
    for n in range(1, n_attempts + 1):
        wt = tmp_path / f"wt{n}"
        repo.git.worktree("add", "-q", "-b", git_ops.branch_name(n), str(wt), "main")
        (wt / "train.py").write_text(f"print({n})\n")
        sha, _ = git_ops.commit_attempt(wt, n, "L3", f"attempt {n}", journal_head=j.head())
        je.append(j, je.AttemptEntry(number=n, branch=git_ops.branch_name(n), commit=sha, summary=f"attempt {n}",
                                     agent="scripted", started_at=time.time()), author="agent", attempt=n)
        je.declare(j, n, "L3", "sure", author="agent")
        j.append("check", {"kind": "short", "achieved_level": "L1", "checks": []}, author="ladder", attempt=n)
    git_ops.anchor_tag(repo, "m", j.head())
    j.close()
    return tmp_path / "journal.sqlite", repo_dir


def _rehash(path: Path, key: bytes | None = None) -> None:
    """What a determined tamperer does: edit a declaration, then recompute every hash with ladder's own code."""
    from ladder._util.hashing import canonical_json, sha256_bytes
    from ladder.journal.store import GENESIS_SHA256, entry_sha256

    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER entries_no_update")
    rows = conn.execute("SELECT seq, kind, author, created_at, attempt, content, corrects, reason FROM entries "
                        "ORDER BY seq").fetchall()
    prev = GENESIS_SHA256
    for seq, kind, author, created_at, attempt, content, corrects, reason in rows:
        if kind == "declaration":
            content = json.dumps({**json.loads(content), "level": "L1"}, sort_keys=True, separators=(",", ":"))
        c_sha = sha256_bytes(content.encode())
        e_sha = entry_sha256(key=key, seq=seq, kind=kind, author=author, created_at=created_at, attempt=attempt,
                             content_sha256=c_sha, prev_sha256=prev, corrects=corrects, reason=reason)
        conn.execute("UPDATE entries SET content=?, content_sha256=?, prev_sha256=?, entry_sha256=? WHERE seq=?",
                     (content, c_sha, prev, e_sha, seq))
        prev = e_sha
    conn.execute("CREATE TRIGGER entries_no_update BEFORE UPDATE ON entries BEGIN SELECT RAISE(ABORT, 'no'); END")
    conn.commit()
    conn.close()


def test_a_cut_journal_verifies_alone_but_not_against_its_git_anchors(tmp_path: Path) -> None:
    from ladder.journal.store import verify_journal
    from ladder.supervisor.git_ops import journal_anchors

    path, repo = _journal_with_anchored_commits(tmp_path)
    anchors = journal_anchors(repo, "m")
    assert len(anchors) == 4 and verify_journal(path, anchors=anchors).ok  # 3 commits + the final tag
    conn = sqlite3.connect(path)
    conn.execute("DROP TRIGGER entries_no_delete")
    conn.execute("DELETE FROM entries WHERE seq > 7")  # the last two attempts, gone
    conn.execute("UPDATE sqlite_sequence SET seq = 7 WHERE name = 'entries'")
    conn.execute("CREATE TRIGGER entries_no_delete BEFORE DELETE ON entries BEGIN SELECT RAISE(ABORT, 'no'); END")
    conn.commit()
    conn.close()
    assert verify_journal(path).ok  # the chain alone cannot see a clean cut ...
    cut = verify_journal(path, anchors=anchors)  # ... the anchors in git can
    assert not cut.ok and any("cut off" in p for p in cut.problems) and cut.first_bad_seq == 8


def test_a_rehashed_journal_fails_against_its_anchors_and_without_the_key(tmp_path: Path, monkeypatch) -> None:
    from ladder.journal.store import verify_journal
    from ladder.supervisor.git_ops import journal_anchors

    path, repo = _journal_with_anchored_commits(tmp_path / "plain")
    _rehash(path)
    assert verify_journal(path).ok  # recomputed with ladder's own hash: the chain is consistent again
    bad = verify_journal(path, anchors=journal_anchors(repo, "m"))
    assert not bad.ok and any("rewritten" in p for p in bad.problems)

    monkeypatch.setenv("LADDER_JOURNAL_KEY", "a secret the tamperer does not have")
    keyed, _ = _journal_with_anchored_commits(tmp_path / "keyed")
    assert verify_journal(keyed).ok
    _rehash(keyed, key=None)  # no key: plain sha256
    assert not verify_journal(keyed).ok
    monkeypatch.delenv("LADDER_JOURNAL_KEY")
    unkeyed = verify_journal(keyed)
    assert not unkeyed.ok and "set LADDER_JOURNAL_KEY" in unkeyed.problems[-1]
