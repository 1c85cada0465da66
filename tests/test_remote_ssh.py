"""The ssh runner against a real sshd (tests/sshd.py): the same run contract as a local run, kept on another
machine. Each test drives the real runner (ladder.runs.execute.execute_run) and looks at what it left here and,
through the filesystem of "the machine", what it left there.
"""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest

from ladder.migration.spec import load_spec
from ladder.runs.execute import execute_run
from ladder.runs.records import RunRecord
from ladder._util.hashing import verify_manifest
from sshd import ssh_env, sshd, workspace  # noqa: F401 (fixtures)


@pytest.fixture(autouse=True)
def _env(ssh_env) -> None:
    pass


def remote_dir(record: RunRecord) -> Path:
    assert record.remote is not None
    return Path(record.remote.run_dir)


def run_processes(remote: Path) -> list[int]:
    """Live processes of a run on the machine (this one): working in its directory, or naming it in their argv
    (the run's own pids are its sandbox's PID namespace numbers, not the machine's)."""
    found = []
    for p in Path("/proc").iterdir():
        if not p.name.isdigit():
            continue
        try:
            state = (p / "stat").read_text().rsplit(")", 1)[1].split()[0]
            cwd = os.readlink(p / "cwd")
            argv = (p / "cmdline").read_bytes().decode(errors="replace")
        except OSError:
            continue
        if state not in ("Z", "X") and (cwd.startswith(str(remote)) or str(remote) in argv):
            found.append(int(p.name))
    return found


def test_a_run_that_passes_is_recorded_here_as_a_local_run_is(tmp_path, sshd) -> None:
    ws = workspace(tmp_path, sshd)
    events: list[str] = []
    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short", seed=2,
                         progress=lambda ev, data: events.append(ev))
    assert record.exit_code == 0 and not record.timed_out and record.infrastructure is None
    assert record.loss_lines == 30 and [p.step for p in record.loss_curve] == list(range(1, 31))
    assert record.metric == pytest.approx(0.902) and record.evals and record.evals[0].items == 100
    assert record.runner == "ssh" and record.remote is not None
    assert record.remote.host == sshd.alias and record.remote.run_dir.startswith(str(sshd.remote_root))
    # one clock: the machine's; its offset from ours is measured (the same machine here: near zero)
    assert record.remote.clock_offset_s is not None and abs(record.remote.clock_offset_s) < 0.5
    assert 0 < record.remote.clock_rtt_s < 5
    assert set(record.remote.timings) >= {"connect", "env", "sync", "start", "collect"}
    assert record.sandbox == "bwrap" and record.price_per_hour == 2.0
    assert record.command.startswith(str(sshd.remote_root / "cache" / "envs"))  # the environment built there
    assert "start" in events and "loss" in events and events[-1] == "end"
    run_dir = ws / "runs" / "remote-test" / record.run_id
    # the logs, the probe's reports and run.json are here, sealed by the same manifest
    assert (run_dir / "stdout.log").read_bytes() == (remote_dir(record) / "stdout.log").read_bytes()
    first = (run_dir / "stdout.log").read_text().splitlines()[0].split("\t")
    assert float(first[0]) >= 0 and first[1] == "step 1 loss 1.002000"
    assert list((run_dir / "probe").glob("probe-*.json")) and record.probe is not None
    assert record.probe["processes"][0]["pid"] != os.getpid()
    assert not verify_manifest(run_dir)
    assert RunRecord.load(run_dir).model_dump() == record.model_dump()
    assert not (remote_dir(record) / "work").exists()  # the copy of the code is removed there too
    # the environment is built once per hash of its setup commands: a second run reuses it
    again = execute_run(load_spec(ws / "ladder.toml"), "target", "short", seed=3)
    assert again.exit_code == 0 and again.remote.timings["env"] < record.remote.timings["env"] + 5


def test_a_crash_is_the_code_s_failure_with_its_error_lines(tmp_path, sshd) -> None:
    ws = workspace(tmp_path, sshd, mode="crash")
    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short")
    assert record.exit_code == 1 and record.infrastructure is None and not record.killed
    assert record.loss_lines == 3 and record.metric is None
    assert any("RuntimeError: the port broke at step 3" in line for line in record.error_lines)


def test_a_timeout_kills_the_whole_tree_on_the_machine(tmp_path, sshd) -> None:
    ws = workspace(tmp_path, sshd, mode="hang", steps=2)
    during: list[int] = []

    def progress(ev: str, data: dict) -> None:
        if ev == "loss" and not during:
            time.sleep(0.5)  # the child is started before the first step
            remote = RunRecord.load(Path(data.get("run_dir", ws / "runs" / "remote-test" / sorted(
                p.name for p in (ws / "runs" / "remote-test").iterdir())[-1]))).remote
            during.extend(run_processes(Path(remote.run_dir)))

    t0 = time.time()
    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short", timeout_s=15, progress=progress)
    assert len(during) >= 2, "the scan must see the run's processes while it runs"
    assert record.timed_out and record.exit_code is not None and record.exit_code < 0
    assert time.time() - t0 < 60
    assert len((remote_dir(record) / "test-pids.txt").read_text().split()) == 2  # the program and its child
    end = time.time() + 10
    while run_processes(remote_dir(record)) and time.time() < end:
        time.sleep(0.1)
    assert not run_processes(remote_dir(record)), "a process of the timed-out run outlived it"


def test_a_dropped_connection_is_reopened_and_the_stream_goes_on_without_a_gap_or_a_repeat(tmp_path, sshd) -> None:
    ws = workspace(tmp_path, sshd, steps=80, sleep=0.05)
    dropped: list[int] = []

    def progress(ev: str, data: dict) -> None:
        if ev == "loss" and data["step"] >= 15 and not dropped:
            dropped.append(sshd.drop_connections())

    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short", progress=progress)
    assert dropped and dropped[0] >= 1
    assert record.exit_code == 0 and record.infrastructure is None
    assert record.remote.reconnects >= 1 and any("connection lost" in n for n in record.notes)
    assert [p.step for p in record.loss_curve] == list(range(1, 81)) and record.loss_lines == 80
    assert record.metric == pytest.approx(0.9)


def test_a_secret_in_ladder_s_environment_never_reaches_the_machine(tmp_path, sshd, monkeypatch) -> None:
    monkeypatch.setenv("LADDER_TEST_API_TOKEN", "sk-not-for-the-run")
    monkeypatch.setenv("LADDER_TEST_PLAIN", "plain-but-local")
    monkeypatch.setenv("LADDER_TEST_PASSED", "named-in-pass-env")
    ws = workspace(tmp_path, sshd, mode="env", steps=2,
                   extra='pass_env = ["LADDER_TEST_PASSED"]\nenv = { FROM_PROFILE = "1" }')
    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short")
    assert record.exit_code == 0
    names = {line.split(" ", 1)[1] for line in (ws / "runs" / "remote-test" / record.run_id / "stdout.log")
             .read_text().splitlines() if "\tenv " in line for line in [line.split("\t", 1)[1]]}
    assert {"FROM_PROFILE", "LADDER_TEST_PASSED", "LADDER_PROBE_DIR", "HOME"} <= names
    assert "LADDER_TEST_API_TOKEN" not in names and "LADDER_TEST_PLAIN" not in names
    # nothing the machine kept holds the secret either (request, logs, the agent's log)
    for p in remote_dir(record).rglob("*"):
        if p.is_file():
            assert b"sk-not-for-the-run" not in p.read_bytes(), p


def test_env_build_failure_on_the_machine_is_the_infrastructure_s_not_the_port_s(tmp_path, sshd) -> None:
    ws = workspace(tmp_path, sshd, setup='["{python} -m venv --without-pip {env}", "exit 3"]')
    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short")
    assert record.infrastructure is not None and record.infrastructure.kind == "env_build_failed"
    assert "exit 3" in record.infrastructure.detail and record.exit_code is None
    from ladder.checks import CheckContext, run_ladder
    from ladder.journal.notes import draft_notes
    from ladder.migration.protocol import load_protocol

    result = run_ladder(CheckContext(run=record, protocol=load_protocol()), up_to="L0")
    assert result.achieved_level is None
    finished = next(c for c in result.checks if c.name == "finished")
    assert finished.status == "not_checked" and "env_build_failed" in finished.evidence
    (note,) = draft_notes(result, record)
    assert note.check == "infrastructure/env_build_failed" and not note.silent


def test_an_unreachable_machine_is_a_lost_connection(tmp_path) -> None:
    ws = workspace(tmp_path, None, extra="[protocol_overrides.infrastructure]\nreconnect_tries = 1\n"
                                          "reconnect_backoff_s = 0.1\n")
    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short")
    assert record.infrastructure is not None and record.infrastructure.kind == "connection_lost"
    assert record.remote.reconnects == 1 and "unreachable.invalid" in record.infrastructure.detail
    assert record.ended_at is not None and not verify_manifest(ws / "runs" / "remote-test" / record.run_id)


def test_reattach_follows_a_run_a_killed_ladder_left_and_never_starts_it_twice(tmp_path, sshd) -> None:
    import signal
    import subprocess
    import sys

    ws = workspace(tmp_path, sshd, steps=60, sleep=0.05)
    run_dir = ws / "runs" / "manual"
    code = ("import sys; from ladder.migration.spec import load_spec; from ladder.runs.execute import execute_run; "
            f"execute_run(load_spec({str(ws / 'ladder.toml')!r}), 'target', 'short', run_dir=__import__('pathlib')"
            f".Path({str(run_dir)!r}))")
    proc = subprocess.Popen([sys.executable, "-c", code], env=os.environ.copy())
    end = time.time() + 60
    while time.time() < end:
        try:
            rec = RunRecord.load(run_dir)
            if rec.remote and rec.remote.run_dir and (Path(rec.remote.run_dir) / "stdout.log").stat().st_size > 100:
                break
        except Exception:
            pass
        time.sleep(0.05)
    os.kill(proc.pid, signal.SIGKILL)  # ladder dies; the run goes on there
    proc.wait()
    rec = RunRecord.load(run_dir)
    assert rec.ended_at is None
    from ladder.runs.remote.execute import reattach_remote_run

    record = reattach_remote_run(load_spec(ws / "ladder.toml"), run_dir)
    assert record is not None and record.exit_code == 0
    assert [p.step for p in record.loss_curve] == list(range(1, 61))
    assert any("not started again" in n for n in record.notes)
    requests = list((sshd.remote_root / "runs" / "remote-test").glob(f"{run_dir.name}-*/request.json"))
    assert len(requests) == 1
    assert json.loads((remote_dir(record) / "supervisor.json").read_text())["pid"] > 0
    assert reattach_remote_run(load_spec(ws / "ladder.toml"), run_dir) is None  # finished: nothing to do
