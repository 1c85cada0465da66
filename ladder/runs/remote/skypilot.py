"""The skypilot runner: a run as a SkyPilot job, through SkyPilot's Python SDK (its API server does the clouds).

A profile's `[profiles.X.skypilot]` table becomes a `sky.Task`: its Resources (accelerators such as `L4:1` or
`tpu-v5e-8`, infra, spot), a setup that builds the profile's environment with ladder's agent (the profile's
`setup` commands, once per hash of them, on the cluster, as every runner does), ladder's bundle as a file
mount, and a run command that is the agent's `job`. The cluster is launched, or reused when it is up
(`sky.launch` also refreshes the setup and the bundle), the job is submitted by `sky.exec`, its output is
followed with `sky.tail_logs`, and the run's files (logs, probe reports, exit record) come back at the end of
that same stream. Autostop comes from the profile; `down = true` tears the cluster down after the run.

The price per hour defaults to SkyPilot's catalog price of what it launched (the handle's resources x nodes);
the profile's `price_per_hour` overrides it; either way run.json says which (`remote.price_source`).

Times: every time in the record is the cluster's clock (its timestamped log lines, the probe); they are used
as durations only, so no offset is needed (none is measured through SkyPilot).

Must not: import SkyPilot at module level (it is an optional extra: `pip install 'ladder[skypilot]'`).
"""

from __future__ import annotations

import base64
import io
import json
import os
import tarfile
import time
import uuid
from pathlib import Path
from typing import Any

from ladder._util.errors import LadderError
from ladder._util.hashing import write_manifest
from ladder.migration.spec import Profile, Spec
from ladder.runs.envs import cache_root
from ladder.runs.execute import Progress, _command, copy_source, line_sink
from ladder.runs.parse import OutputParser
from ladder.runs.provenance import provenance
from ladder.runs.records import RemoteRun, RunRecord
from ladder.runs.remote.agent import JOB_PREFIX, PYTHON_MARK, RUN_DIR_MARK
from ladder.runs.remote.bundle import AGENT, bundle
from ladder.runs.remote.execute import begin, finish_remote, record_infrastructure, run_env
from ladder.runs.remote.session import InfrastructureFailure
from ladder.runs.remote.targets import skypilot_missing

WORKDIR = "~/sky_workdir"  # where SkyPilot puts the task's workdir on the cluster


def _sky() -> Any:
    missing = skypilot_missing()
    if missing:
        raise LadderError(missing, "install the extra, or choose runner = \"ssh\" or \"local\"")
    import sky

    return sky


def local_bundle() -> tuple[str, Path]:
    """ladder's agent bundle unpacked here once (SkyPilot file-mounts a directory, not a tarball)."""
    digest, data = bundle()
    dest = cache_root() / "bundles" / digest
    if not (dest / ".ready").exists():
        tmp = dest.with_name(f"{digest}.tmp{os.getpid()}")
        with tarfile.open(fileobj=io.BytesIO(data), mode="r:gz") as tar:
            tar.extractall(tmp)
        (tmp / ".ready").write_text(digest)
        try:
            tmp.rename(dest)
        except OSError:
            import shutil

            shutil.rmtree(tmp, ignore_errors=True)
    return digest, dest


def resources(profile: Profile) -> Any:
    """The profile's resources as SkyPilot's own Resources (which validates them)."""
    sky = _sky()
    t = profile.skypilot
    assert t is not None
    kw: dict[str, Any] = {"use_spot": t.use_spot}
    for key in ("accelerators", "infra", "instance_type"):
        if getattr(t, key):
            kw[key] = getattr(t, key)
    return sky.Resources(**kw)


def build_tasks(spec: Spec, profile_name: str, kind: str, seed: int, work: Path, remote_dir: str,
                timeout: float, slot: int | None) -> tuple[Any, Any]:
    """(the launch task: resources, setup and the bundle; the exec task: the run) for this run."""
    sky = _sky()
    profile = spec.profile(profile_name)
    t = profile.skypilot
    assert t is not None
    digest, local = local_bundle()
    lib = f"{t.root}/lib/{digest}"
    agent = f"{lib}/{AGENT}"
    prepare = {"cache": f"{t.root}/cache", "setup": profile.setup, "python": profile.python,
               "sandbox": profile.sandbox, "mounts": profile.mounts, "read_only": [f"{lib}/ladder/probe"]}
    # Paths under the cluster's home stay "~/..." (only the cluster knows its home: the agent expands them);
    # the interpreter and the run directory are known there only, and the job fills their markers.
    job = {"prepare": prepare, "run_dir": remote_dir,
           "start": {"command": _command(spec, profile_name, kind, seed, PYTHON_MARK, Path(RUN_DIR_MARK)),
                     "timeout_s": timeout, "pass_env": profile.pass_env,
                     "env": run_env(spec, profile, RUN_DIR_MARK, f"{lib}/ladder/probe", seed, slot)}}
    name = f"ladder-{spec.name}"[:60]
    setup = (f"echo {_q(json.dumps(prepare))} | {t.python} {_home(agent)} prepare")
    launch = sky.Task(name=name, setup=setup, envs={}, file_mounts={lib: str(local)})
    launch.set_resources(resources(profile))
    run = sky.Task(name=name, run=f"{t.python} {_home(agent)} job", workdir=str(work),
                   envs={"LADDER_JOB": json.dumps(job)})
    run.set_resources(resources(profile))
    return launch, run


def _q(text: str) -> str:
    import shlex

    return shlex.quote(text)


def _home(path: str) -> str:
    return '"$HOME"/' + _q(path[2:]) if path.startswith("~/") else _q(path)


def catalog_price(handle: Any) -> tuple[float, str] | None:
    """SkyPilot's catalog price per hour of what it launched, and what it priced; None when it cannot say."""
    try:
        res = handle.launched_resources
        nodes = int(getattr(handle, "launched_nodes", 1) or 1)
        return float(res.get_cost(3600)) * nodes, f"skypilot catalog: {nodes} x {res}"
    except Exception:  # a catalog SkyPilot could not fetch: the run still counts, its cost is unknown
        return None


def execute_skypilot_run(spec: Spec, profile_name: str, kind: str, seed: int, source: Path | None,
                         run_dir: Path | None, progress: Progress | None, timeout_s: float | None,
                         slot: int | None) -> RunRecord:
    sky = _sky()
    profile = spec.profile(profile_name)
    t = profile.skypilot
    assert t is not None
    _, source, run_dir, timeout, integrity = begin(spec, profile_name, kind, seed, source, run_dir, timeout_s)
    remote_dir = f"{t.root}/runs/{spec.name}/{run_dir.name}-{uuid.uuid4().hex[:8]}"
    link_notes = copy_source(source, run_dir / "work", profile.copy_ignore,
                             [Path(os.path.expanduser(m)) for m in profile.mounts])
    launch_task, run_task = build_tasks(spec, profile_name, kind, seed, run_dir / "work", remote_dir, timeout, slot)
    parse = spec.parse_for(profile_name)
    record = RunRecord(
        run_id=run_dir.name, kind=kind, profile=profile_name, platform=profile.platform, seed=seed,  # type: ignore[arg-type]
        command=run_task.run, cwd=f"{remote_dir}/work", started_at=time.time(), timeout_s=timeout,
        metric_name=parse.metric_name, metric_direction=parse.direction,
        provenance=provenance(source, profile.python or "", []), price_per_hour=profile.price_per_hour or 0.0,
        chips=profile.chips, runner="skypilot",
        remote=RemoteRun(runner="skypilot", host=t.cluster, run_dir=remote_dir,
                         price_source="profile" if profile.price_per_hour is not None else ""),
        notes=[f"link kept: {n}" for n in link_notes])
    timings = record.remote.timings  # type: ignore[union-attr]
    try:
        start = time.time()
        _, handle = _launch(sky, launch_task, t, progress)
        timings["launch"] = time.time() - start
        if profile.price_per_hour is None:
            priced = catalog_price(handle)
            if priced is None:
                record.notes.append("SkyPilot's catalog gave no price for the launched resources: set "
                                    "price_per_hour in the profile for the L4 cost check")
            else:
                record.price_per_hour, record.remote.price_source = priced  # type: ignore[union-attr]
        start = time.time()
        job_id, _ = sky.get(sky.exec(run_task, cluster_name=t.cluster))
        timings["start"] = time.time() - start
        record.remote.job_id = job_id  # type: ignore[union-attr]
        record.save(run_dir)  # names the job before it is followed: resume finds it
    except InfrastructureFailure as e:
        return record_infrastructure(record, run_dir, e, progress)
    record = _follow(sky, spec, record, run_dir, progress, integrity)
    if t.down:
        sky.stream_and_get(sky.down(t.cluster), output_stream=io.StringIO())
        record.notes.append(f"cluster {t.cluster} torn down after the run (down = true)")
        record.save(run_dir)
        write_manifest(run_dir)
    return record


def _launch(sky: Any, task: Any, t: Any, progress: Progress | None) -> tuple[Any, Any]:
    from sky import exceptions

    sink = _ProgressStream(progress, t.cluster)
    try:
        request = sky.launch(task, cluster_name=t.cluster, idle_minutes_to_autostop=t.autostop_minutes,
                             down=False, retry_until_up=False)
        return sky.stream_and_get(request, output_stream=sink)
    except exceptions.ResourcesUnavailableError as e:
        raise InfrastructureFailure("launch_failed", f"SkyPilot could not launch {t.cluster}: {e}") from None
    except exceptions.CommandError as e:  # the setup (the environment's build) failed on the cluster
        raise InfrastructureFailure("env_build_failed", f"the setup failed on {t.cluster}: {e}") from None


class _ProgressStream(io.TextIOBase):
    def __init__(self, progress: Progress | None, cluster: str) -> None:
        self.progress, self.cluster = progress, cluster

    def write(self, text: str) -> int:
        if self.progress and text.strip():
            self.progress("env", {"message": f"{self.cluster}: {text.strip()[:300]}"})
        return len(text)


class _JobStream(io.TextIOBase):
    """Reads the job's framed lines out of SkyPilot's log stream (other lines are SkyPilot's own)."""

    def __init__(self, on_frame: Any) -> None:
        self.buf, self.on_frame = "", on_frame

    def write(self, text: str) -> int:
        self.buf += text
        while "\n" in self.buf:
            line, self.buf = self.buf.split("\n", 1)
            at = line.find(JOB_PREFIX.decode())
            if at >= 0:
                self.on_frame(line[at + len(JOB_PREFIX):])
        return len(text)


def _follow(sky: Any, spec: Spec, record: RunRecord, run_dir: Path, progress: Progress | None,
            integrity: Any) -> RunRecord:
    assert record.remote is not None and record.remote.job_id is not None
    cluster, job_id = record.remote.host, record.remote.job_id
    parser = OutputParser(spec.parse_for(record.profile))
    sink = line_sink(parser, progress, spec.steps(record.kind))
    seen = {"O": 0, "E": 0}
    state: dict[str, Any] = {"files": [], "exit": None, "prepared": None}
    logs = {s: open(run_dir / f"{s}.log", "wb") for s in ("stdout", "stderr")}

    def on_frame(frame: str) -> None:
        tag, _, rest = frame.partition(" ")
        if tag in ("O", "E"):
            off, _, line = rest.partition(" ")
            if int(off) <= seen[tag]:  # a stream SkyPilot replayed from the start after a retry
                return
            seen[tag] = int(off)
            stream = "stdout" if tag == "O" else "stderr"
            t_text, _, text = line.partition("\t")
            logs[stream].write(f"{line}\n".encode())
            sink(stream, text, float(t_text))
        elif tag == "X":
            state["exit"] = json.loads(rest)
        elif tag == "P":
            state["prepared"] = json.loads(rest)
        elif tag == "F" and rest != "end":
            state["files"].append(rest)
        elif tag == "L":
            state["lost"] = json.loads(rest)

    if progress:
        progress("start", {"run_dir": str(run_dir), "command": record.command, "timeout_s": record.timeout_s,
                           "host": cluster})
    from sky import exceptions

    try:
        sky.tail_logs(cluster, job_id, follow=True, output_stream=_JobStream(on_frame))
    except (exceptions.ClusterNotUpError, exceptions.ClusterDoesNotExist) as e:
        state["preempted"] = str(e)
    except BaseException:
        for f in logs.values():
            f.close()
        try:
            sky.get(sky.cancel(cluster, job_ids=[job_id]))
        except Exception:
            pass
        record.killed, record.ended_at = True, time.time()
        record.notes.append(f"cancelled: SkyPilot job {job_id} on {cluster} was cancelled")
        record.save(run_dir)
        raise
    finally:
        for f in logs.values():
            f.close()
    prepared = state["prepared"] or {}
    if prepared.get("error") == "env_build_failed":
        return record_infrastructure(record, run_dir, InfrastructureFailure("env_build_failed", prepared["message"]),
                               progress)
    if prepared.get("error"):
        raise LadderError(f"{cluster}: {prepared['message']}", prepared.get("fix"))
    if state["exit"] is None:
        why = state.get("preempted") or _job_status(sky, cluster, job_id)
        return record_infrastructure(record, run_dir, InfrastructureFailure(
            "preempted", f"SkyPilot job {job_id} on {cluster} ended without an exit record: {why}"), progress)
    if state["files"]:
        with tarfile.open(fileobj=io.BytesIO(base64.b64decode("".join(state["files"]))), mode="r:gz") as tar:
            for member in tar:
                if member.isfile() or member.isdir():
                    if not (member.name.startswith(("/", "..")) or "/../" in member.name):
                        tar.extract(member, run_dir)
    record.remote.hostname = prepared.get("hostname", "")
    record.sandbox = prepared.get("sandbox", "none")
    record.provenance.python = prepared.get("python", "")
    record.provenance.packages = prepared.get("packages", [])
    record.provenance.hostname = prepared.get("hostname", "")
    return finish_remote(record, run_dir, state["exit"], parser, integrity, progress)


def _job_status(sky: Any, cluster: str, job_id: int) -> str:
    try:
        return str(sky.get(sky.job_status(cluster, [job_id])).get(job_id))
    except Exception as e:
        return f"{type(e).__name__}: {e}"


def reattach_skypilot_run(spec: Spec, run_dir: Path, record: RunRecord, progress: Progress | None) -> RunRecord | None:
    """A job a stopped ladder left: SkyPilot kept it (and its log) on the cluster; follow it from the start."""
    if record.remote is None or record.remote.job_id is None:
        return None  # never submitted: start it again
    sky = _sky()
    record.notes.append(f"ladder stopped while SkyPilot job {record.remote.job_id} ran on {record.remote.host}: "
                        "it was found there again and followed to its end, not started again")
    return _follow(sky, spec, record, run_dir, progress, lambda: [])
