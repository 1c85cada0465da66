"""A captured run on another machine over ssh, recorded in the local run directory as a local run is.

The contract of a local run, kept there: the code is copied here by the same rules (copy_source), shipped,
and run from its copy; the environment is built there once per hash of its setup commands; the probe is
injected from the shipped bundle; the run gets that machine's environment scrubbed of secrets plus the
profile's `env` and `pass_env` (ladder's own environment never crosses); the sandbox is bubblewrap when the
machine has it; the agent's supervisor (the local runner, there) enforces the timeout and kills the whole
tree. Output streams back as it is written, with the times the machine stamped on it, and is parsed here by
the same parser; run.json, the logs, the probe reports and the manifest end up here.

Detached: the run is started under setsid on the machine and writes its logs there, so a dropped
connection loses nothing (`follow` picks up at its byte offsets) and a ladder killed mid-run finds it again:
run.json names the remote directory before the run starts, and `reattach_remote_run` (the supervisor's
resume) follows a run that is still going, or collects one that finished, instead of starting it again.

Clock: the run's times (started_at, ended_at, every line's t, the probe's timestamps) are all the machine's
own clock, so step times never mix two clocks; its offset from ladder's clock is measured (fastest of three
round trips) and recorded in `remote.clock_offset_s`.

Must not: judge the run, or turn a failure of the machine or the connection into a failure of the code:
those are recorded in `infrastructure` with their kind.
"""

from __future__ import annotations

import json
import os
import posixpath
import shutil
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from ladder._util.errors import LadderError
from ladder._util.hashing import write_manifest
from ladder.migration.protocol import Protocol
from ladder.migration.spec import Profile, Spec, load_spec_protocol
from ladder.runs.execute import (Progress, _command, copy_source, end_event, fill_output, line_sink, new_run_dir,
                                 run_vars, timeout_for)
from ladder.runs.parse import OutputParser
from ladder.runs.provenance import provenance
from ladder.runs.records import InfrastructureFailure as InfraRecord
from ladder.runs.records import RemoteRun, RunRecord
from ladder.runs.remote.session import InfrastructureFailure, Machine, Reconnects
from ladder.runs.remote.ssh import RemoteError, SshConnection

COLLECT = ["stdout.log", "stderr.log", "probe", "pids.json", "exit.json", "supervisor.json", "agent.log",
           "scrubbed.json",
           "parity.npz", "parity.json", "evaluate.json"]  # what a parity side writes (ladder.parity.side)
WATCHDOG_GRACE_S = 120.0  # past the timeout, the supervisor there should have ended the run: kill it from here


def _connect(profile: Profile, reconnects: Reconnects) -> Machine:
    assert profile.ssh is not None
    conn = SshConnection(profile.ssh, keepalive_s=reconnects.policy.keepalive_s)
    try:
        return Machine(conn, profile.ssh.root, profile.ssh.python, reconnects)
    except RemoteError as e:
        raise LadderError(f"cannot use {profile.ssh.host}: {e}", "check that `ssh HOST python3 -V` works from this "
                          "machine, and the profile's ssh table (host, user, port, python)") from None


def _reconnects(protocol: Protocol, progress: Progress | None) -> Reconnects:
    return Reconnects(protocol.infrastructure, (lambda msg: progress("warning", {"message": msg})) if progress else None)


def begin(spec: Spec, profile_name: str, kind: str, seed: int, source: Path | None, run_dir: Path | None,
          timeout_s: float | None) -> tuple[Protocol, Path, Path, float, Callable[[], list[str]]]:
    """(protocol, source, run directory, timeout, what changed in the workspace since now) for a remote run."""
    from ladder.migration.workspace import changes, protected_state

    protocol = load_spec_protocol(spec)
    source = (source or spec.source_dir).resolve()
    if not source.is_dir():
        raise LadderError(f"source {source} is not a directory", "pass --source DIR of a checkout")
    guarded = protected_state(spec)
    run_dir = (run_dir or new_run_dir(spec, profile_name, kind, seed)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    timeout = timeout_s if timeout_s is not None else timeout_for(spec, protocol, kind)
    return protocol, source, run_dir, timeout, lambda: changes(guarded, protected_state(spec))


def run_env(spec: Spec, profile: Profile, remote_dir: str, probe_dir: str, seed: int,
            slot: int | None) -> dict[str, str]:
    """What the request adds to the machine's own (scrubbed) environment: never ladder's environment, except
    the variables `pass_env` names."""
    env = dict(profile.env)
    env.update({k: os.environ[k] for k in profile.pass_env if k in os.environ})
    env.update({"PYTHONPATH": probe_dir, "LADDER_PROBE_DIR": f"{remote_dir}/probe",
                "LADDER_PROBE_OPTS": json.dumps(spec.probe_options(profile).model_dump(), sort_keys=True)})
    env.update(run_vars(remote_dir, seed, slot))
    return env


def execute_remote_run(spec: Spec, profile_name: str, kind: str, seed: int, source: Path | None,
                       run_dir: Path | None, progress: Progress | None, timeout_s: float | None,
                       slot: int | None, command: str | None = None) -> RunRecord:
    """A run on the profile's machine. `command` replaces the spec's command (a parity side, ladder.parity):
    the files already in run_dir (the side's script and inputs) go along into the machine's run directory,
    and what the side writes there (SIDE_OUTPUTS) comes back."""
    profile = spec.profile(profile_name)
    if profile.runner == "skypilot":
        if command is not None:
            raise LadderError(f"profile {profile_name!r} runs on skypilot, where ladder runs only the experiment's "
                              f"own commands: a {kind} side needs a local or ssh profile",
                              "run parity with a profile whose runner is local or ssh")
        from ladder.runs.remote.skypilot import execute_skypilot_run

        return execute_skypilot_run(spec, profile_name, kind, seed, source, run_dir, progress, timeout_s, slot)
    assert profile.ssh is not None
    given = [p for p in run_dir.iterdir() if p.is_file()] if command is not None and run_dir and run_dir.is_dir() else []
    protocol, source, run_dir, timeout, integrity = begin(spec, profile_name, kind, seed, source, run_dir, timeout_s)
    timings: dict[str, float] = {}
    reconnects = _reconnects(protocol, progress)
    parse = spec.parse_for(profile_name)
    record = RunRecord(
        run_id=run_dir.name, kind=kind, profile=profile_name, platform=profile.platform, seed=seed,  # type: ignore[arg-type]
        command="", cwd="", started_at=time.time(), timeout_s=timeout,
        metric_name=parse.metric_name, metric_direction=parse.direction,
        provenance=provenance(source, "", []), price_per_hour=profile.price_per_hour or 0.0, chips=profile.chips,
        runner="ssh", remote=RemoteRun(runner="ssh", host=profile.ssh.host, run_dir="", timings=timings,
                                       price_source="profile"))
    timings = record.remote.timings  # (validation copied the dict)
    try:
        t = time.time()
        machine = _connect(profile, reconnects)
        offset, rtt = machine.clock_offset()
        timings["connect"] = time.time() - t
        remote_dir = f"{machine.root}/runs/{spec.name}/{run_dir.name}-{uuid.uuid4().hex[:8]}"
        record.started_at = time.time() + offset
        record.cwd = f"{remote_dir}/work"
        record.remote.hostname, record.remote.run_dir = machine.hostname, remote_dir
        record.remote.clock_offset_s, record.remote.clock_rtt_s = offset, rtt
        t = time.time()
        prepared = machine.prepare({"name": profile_name, "cache": profile.ssh.cache or f"{machine.root}/cache",
                                    "setup": profile.setup,
                                    "python": profile.python, "sandbox": profile.sandbox, "mounts": profile.mounts,
                                    "read_only": [machine.probe_dir]},
                                   (lambda m: progress("env", {"message": f"{machine.hostname}: {m}"})) if progress
                                   else None)
        timings["env"] = time.time() - t
        if prepared.get("error") == "spec":
            raise LadderError(f"{profile.ssh.host}: {prepared['message']}", prepared.get("fix"))
        if prepared.get("error"):
            raise InfrastructureFailure("env_build_failed", f"on {machine.hostname}: {prepared['message']}"[:3000])
        t = time.time()
        link_notes = copy_source(source, run_dir / "work", profile.copy_ignore,
                                 [Path(os.path.expanduser(m)) for m in profile.mounts])
        machine.put_dir(run_dir / "work", f"{remote_dir}/work")
        if given:
            with tempfile.TemporaryDirectory() as stage:
                for f in given:
                    shutil.copy2(f, Path(stage) / f.name)
                machine.put_dir(Path(stage), remote_dir)
        timings["sync"] = time.time() - t
        record.command = _command(spec, profile_name, kind, seed, prepared["python"], Path(remote_dir),
                                  template=command)
        record.provenance = provenance(source, prepared["python"], prepared.get("packages", []))
        record.provenance.hostname = machine.hostname
        record.sandbox = prepared["sandbox"]
        record.notes += [f"link kept: {n}" for n in link_notes]
        if prepared.get("sandbox_warning"):
            record.notes.append(f"{machine.hostname}: {prepared['sandbox_warning']}")
            if progress:
                progress("warning", {"message": prepared["sandbox_warning"]})
        request = {"command": record.command, "cwd": f"{remote_dir}/work", "timeout_s": timeout,
                   "env": run_env(spec, profile, remote_dir, machine.probe_dir, seed, slot),
                   "pass_env": profile.pass_env, "sandbox": prepared["sandbox"], "read_only": prepared["read_only"],
                   "writable": [remote_dir]}
        record.save(run_dir)  # names the remote directory before anything starts there: resume finds it
        t = time.time()
        machine.call("start", remote_dir, stdin=json.dumps(request).encode())
        timings["start"] = time.time() - t
    except InfrastructureFailure as e:
        return _record_infrastructure(record, run_dir, reconnects, e, progress)
    return _follow_and_collect(spec, machine, record, run_dir, progress, integrity)


def reattach_remote_run(spec: Spec, run_dir: Path, progress: Progress | None = None) -> RunRecord | None:
    """Finish recording a remote run that a stopped ladder left: follow it while it still runs, collect it when
    it finished. None when run_dir holds no remote run, or the run never started there (start it again)."""
    try:
        record = RunRecord.load(run_dir)
    except LadderError:
        return None
    if record.remote is None or record.ended_at is not None:
        return None
    if record.remote.runner == "skypilot":
        from ladder.runs.remote.skypilot import reattach_skypilot_run

        return reattach_skypilot_run(spec, run_dir, record, progress)
    reconnects = _reconnects(load_spec_protocol(spec), progress)
    try:
        machine = _connect(spec.profile(record.profile), reconnects)
        state = machine.status(record.remote.run_dir)["state"]
    except InfrastructureFailure as e:
        return _record_infrastructure(record, run_dir, reconnects, e, progress)
    if state == "absent":
        return None
    record.notes.append(f"ladder stopped while the run was {state} on {record.remote.hostname}: it was found there "
                        "again and followed to its end, not started again")
    return _follow_and_collect(spec, machine, record, run_dir, progress, lambda: [])


def _record_infrastructure(record: RunRecord, run_dir: Path, reconnects: Reconnects, e: InfrastructureFailure,
                           progress: Progress | None) -> RunRecord:
    assert record.remote is not None
    record.remote.reconnects = reconnects.count
    record.notes += reconnects.log[-10:]
    return record_infrastructure(record, run_dir, e, progress)


def record_infrastructure(record: RunRecord, run_dir: Path, e: InfrastructureFailure,
                          progress: Progress | None) -> RunRecord:
    """A run the machine or the connection failed: recorded as such (never as the code's failure), and sealed."""
    record.infrastructure = InfraRecord(kind=e.kind, detail=e.detail[:3000])  # type: ignore[arg-type]
    record.ended_at = time.time() + ((record.remote.clock_offset_s if record.remote else None) or 0.0)
    record.notes.append(f"infrastructure failure ({e.kind}), not the code's: {e.detail[:500]}")
    record.save(run_dir)
    write_manifest(run_dir)
    if progress:
        progress("warning", {"message": f"infrastructure failure ({e.kind}): {e.detail[:300]}"})
        progress("end", {**end_event(record, run_dir), "infrastructure": e.kind})
    return record


def _follow_and_collect(spec: Spec, machine: Machine, record: RunRecord, run_dir: Path, progress: Progress | None,
                        integrity: Any) -> RunRecord:
    assert record.remote is not None
    remote_dir = record.remote.run_dir
    parser = OutputParser(spec.parse_for(record.profile))
    sink = line_sink(parser, progress, spec.steps(record.kind))
    logs = {s: open(run_dir / f"{s}.log", "wb") for s in ("stdout", "stderr")}
    flushed = [0.0]

    def on_line(stream: str, t: float, text: str) -> None:
        logs[stream].write(f"{t:.3f}\t{text}\n".encode())
        if time.time() - flushed[0] > 0.2:  # a ladder killed now still leaves the lines it had
            logs[stream].flush()
            flushed[0] = time.time()
        sink(stream, text, t)

    if progress:
        progress("start", {"run_dir": str(run_dir), "command": record.command, "timeout_s": record.timeout_s,
                           "host": record.remote.host})
    deadline = record.started_at - (record.remote.clock_offset_s or 0.0) + record.timeout_s + WATCHDOG_GRACE_S
    watchdog = threading.Timer(max(1.0, deadline - time.time()), lambda: machine.kill(remote_dir, 1.0))
    watchdog.daemon = True
    watchdog.start()
    failure: InfrastructureFailure | None = None
    exit_info: dict[str, Any] = {}
    try:
        exit_info = machine.follow(remote_dir, {"stdout": 0, "stderr": 0}, on_line)
    except InfrastructureFailure as e:
        failure = e
    except BaseException:  # Ctrl-C, SIGTERM: cancel there too, keep what it left, then stop
        watchdog.cancel()
        for f in logs.values():
            f.close()
        try:
            machine.kill(remote_dir, 5.0)
            machine.get_files(remote_dir, COLLECT, run_dir)
        except Exception:
            pass
        record.killed, record.ended_at = True, time.time() + (record.remote.clock_offset_s or 0.0)
        record.notes.append("cancelled: the run was killed on its machine")
        record.save(run_dir)
        raise
    finally:
        watchdog.cancel()
        for f in logs.values():
            f.close()
    if failure is not None:
        return _record_infrastructure(record, run_dir, machine.reconnects, failure, progress)
    t = time.time()
    try:
        machine.get_files(remote_dir, COLLECT, run_dir)  # the machine's own logs replace the streamed copies
        record.notes += _collect_export(spec, machine, record, remote_dir, run_dir)
        machine.remove(f"{remote_dir}/work")
    except InfrastructureFailure as e:
        return _record_infrastructure(record, run_dir, machine.reconnects, e, progress)
    record.remote.timings["collect"] = time.time() - t
    record.remote.reconnects = machine.reconnects.count
    record.notes += machine.reconnects.log[-10:]
    return finish_remote(record, run_dir, exit_info, parser, integrity, progress)


def _collect_export(spec: Spec, machine: Machine, record: RunRecord, remote_dir: str, run_dir: Path) -> list[str]:
    """A full run's exported weights ([parity].export, written in its working directory there) come back into
    the run directory, as a local run's move there (ladder.runs.execute.collect_export)."""
    name = spec.parity.export if spec.parity else None
    if record.kind != "full" or not name:
        return []
    cwd = posixpath.normpath(f"{remote_dir}/work/{spec.profile(record.profile).cwd}")
    with tempfile.TemporaryDirectory() as tmp:
        machine.get_files(cwd, [name], Path(tmp))
        got = Path(tmp) / name
        if not got.is_file():
            return [f"the full run wrote no {name} ([parity].export) in its working directory"]
        shutil.move(str(got), str(run_dir / Path(name).name))
    return [f"exported weights kept: {Path(name).name}"]


def finish_remote(record: RunRecord, run_dir: Path, exit_info: dict[str, Any], parser: OutputParser, integrity: Any,
                  progress: Progress | None) -> RunRecord:
    """The record of a remote run whose files are back in run_dir: its exit record (the agent's exit.json), the
    output the parser read, the probe's reports; then run.json and the manifest, as a local run ends."""
    from ladder.runs.probe_report import merge_reports

    assert record.remote is not None
    if exit_info.get("started_at") is not None:
        record.started_at = exit_info["started_at"]  # the machine's clock, like every time below
    record.ended_at = exit_info.get("ended_at") or time.time() + (record.remote.clock_offset_s or 0.0)
    record.exit_code = exit_info.get("exit_code")
    record.timed_out = bool(exit_info.get("timed_out"))
    record.killed = (exit_info.get("killed_by_signal") is not None and not record.timed_out) or bool(
        exit_info.get("cancelled"))
    if exit_info.get("error"):
        record.notes.append(f"the agent on {record.remote.hostname} failed to run the command: {exit_info['error']}")
    record.log_files = dict(exit_info.get("log_files") or {"stdout": "stdout.log", "stderr": "stderr.log"})
    try:
        removed = json.loads((run_dir / "scrubbed.json").read_text())
    except (OSError, ValueError):
        removed = []
    if removed:
        record.notes.append(f"scrubbed from the environment on {record.remote.hostname}: {', '.join(removed)}")
    record.probe = merge_reports(run_dir / "probe")
    record.integrity = integrity()
    fill_output(record, parser)
    record.save(run_dir)
    write_manifest(run_dir)
    if progress:
        progress("end", end_event(record, run_dir))
    return record
