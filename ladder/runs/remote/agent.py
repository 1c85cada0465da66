"""The remote end of ladder's remote runners: run on the machine itself, by the machine's own python3.

Standard library only, plus the ladder modules `bundle` ships beside it (the environment cache, the local
runner, its sandbox, process tree and secret scrub): a run on that machine is a local run there, kept by the
same code. Commands (`python3 agent.py COMMAND RUN_DIR ...`, JSON on stdin and stdout):

  prepare   build the profile's environment once (cached by the hash of its setup commands, as locally),
            resolve the sandbox and the interpreter, list the packages
  start     start the run detached: `supervise` under setsid, its output in RUN_DIR, never twice
  supervise (detached) run the command through the local runner: timestamped logs, the timeout and the
            whole-tree kill; write exit.json last
  follow    stream RUN_DIR's logs from byte offsets as framed lines, then the exit record
  status    running, finished, lost (the supervisor died without an exit record) or absent
  kill      cancel: SIGTERM to the supervisor (it kills the tree), then SIGKILL to what pids.json lists
  job       (SkyPilot) all of it in one foreground job: prepare, copy the job's working directory, supervise
            as a child (a cancelled job takes the run down), follow to stdout, then the run's files
  clock     this machine's time for each line read, for the clock offset
  pack / unpack   a tar stream of files out of, or into, a directory

Must not: trust the caller's environment (the run gets this machine's environment scrubbed of secrets, plus
what the request names), start a run whose directory already holds one, or print anything but its replies
on stdout.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import Any, Callable

REQUEST, SUPERVISOR, EXIT, AGENT_LOG = "request.json", "supervisor.json", "exit.json", "agent.log"
LOGS = {"stdout": "stdout.log", "stderr": "stderr.log"}
TAGS = {"stdout": b"O", "stderr": b"E"}
POLL_S = 0.1
HEARTBEAT_S = 5.0


class Cancelled(Exception):
    """SIGTERM or SIGHUP reached the supervisor: the local runner's cleanup kills the run's tree."""


def _start_ticks(pid: int) -> int | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    rest = text[text.rindex(")") + 2:].split()
    return None if rest[0] in ("Z", "X") else int(rest[19])


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text(json.dumps(data))
    tmp.replace(path)


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


def _reply(data: dict[str, Any]) -> None:
    sys.stdout.write(json.dumps(data) + "\n")
    sys.stdout.flush()


# ------------------------------------------------------------------------------------------- prepare

def _say_on_stderr() -> Callable[[str, dict], None]:
    """An environment build's progress in words, a line each on stderr (ladder shows them as they come)."""
    from ladder._progress import Narrator

    narrator = Narrator("")

    def say(event: str, data: dict) -> None:
        line = narrator.line(event, data)
        if line:
            print(line, file=sys.stderr, flush=True)

    return say


PREPARE_REFUSED = 3  # prepare's exit code when its reply carries an error (the reply says which)


def prepare(req: dict[str, Any]) -> dict[str, Any]:
    from ladder._util.errors import LadderError
    from ladder.runs.envs import ensure_env, package_list, resolve_interpreter
    from ladder.runs.runner.sandbox import interpreter_paths, resolve

    os.environ["LADDER_CACHE"] = os.path.expanduser(req["cache"])
    out: dict[str, Any] = {"hostname": os.uname().nodename, "time": time.time()}
    try:
        sandbox, warning = resolve(req.get("sandbox", "auto"))
    except LadderError as e:
        return {**out, "error": "spec", "message": e.message, "fix": e.fix}
    missing = [m for m in req.get("mounts", []) if not os.path.exists(os.path.expanduser(m))]
    if missing:
        return {**out, "error": "spec", "message": f"the profile mounts {', '.join(missing)}, which do not exist on "
                f"{out['hostname']}", "fix": "create them there, or fix the profile's `mounts`"}
    setup = req.get("setup")
    try:
        if setup:
            env = ensure_env(setup, req.get("python") or "{env}/bin/python", _say_on_stderr(), req.get("name", ""))
            python, built = env.python, env.built_now
        else:
            python, built = resolve_interpreter(req.get("python") or sys.executable), False
    except LadderError as e:
        kind = "env_build_failed" if setup else "spec"
        return {**out, "error": kind, "message": e.message, "fix": e.fix}
    mounts = [os.path.expanduser(m) for m in req.get("mounts", [])]
    cache = Path(os.environ["LADDER_CACHE"]) / "envs"
    read_only = [*interpreter_paths(python), cache, *mounts, *map(os.path.expanduser, req.get("read_only", []))]
    return {**out, "python": python, "built_now": built, "sandbox": sandbox, "sandbox_warning": warning,
            "packages": package_list(python), "read_only": [str(p) for p in read_only],
            "python_version": sys.version.split()[0]}


# --------------------------------------------------------------------------------------------- start

def status(run_dir: Path) -> dict[str, Any]:
    out: dict[str, Any] = {"time": time.time()}
    done = _read_json(run_dir / EXIT)
    if done is not None:
        return {**out, "state": "finished", "exit": done}
    sup = _read_json(run_dir / SUPERVISOR)
    if sup is None:
        return {**out, "state": "absent" if not (run_dir / REQUEST).exists() else "starting"}
    if _start_ticks(int(sup["pid"])) == sup.get("start_ticks"):
        return {**out, "state": "running", "supervisor": sup}
    done = _read_json(run_dir / EXIT)  # it may have finished between the two reads
    if done is not None:
        return {**out, "state": "finished", "exit": done}
    return {**out, "state": "lost", "supervisor": sup}


def start(run_dir: Path, req: dict[str, Any], wait_s: float = 30.0) -> dict[str, Any]:
    run_dir.mkdir(parents=True, exist_ok=True)
    if (run_dir / REQUEST).exists():  # never twice: a retried `start` reports the run that is there
        return {**status(run_dir), "started": False}
    _write_json(run_dir / REQUEST, req)
    with open(run_dir / AGENT_LOG, "ab") as log:
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "supervise", str(run_dir)], cwd=run_dir,
                         stdin=subprocess.DEVNULL, stdout=log, stderr=log, start_new_session=True,
                         env={k: v for k, v in os.environ.items() if k != "PYTHONPATH"})
    end = time.time() + wait_s
    while time.time() < end:
        st = status(run_dir)
        if st["state"] != "starting":
            return {**st, "started": True}
        time.sleep(0.02)
    return {**status(run_dir), "started": True}


def _cancel(signum: int, frame: Any) -> None:
    raise Cancelled(signal.Signals(signum).name)


def _run_env(req: dict[str, Any], run_dir: Path) -> dict[str, str]:
    from ladder.runs.runner.scrub import scrubbed_env

    env, removed = scrubbed_env(dict(os.environ), req.get("pass_env", []))
    extra = dict(req.get("env", {}))
    if extra.get("PYTHONPATH") and env.get("PYTHONPATH"):
        extra["PYTHONPATH"] = extra["PYTHONPATH"] + os.pathsep + env["PYTHONPATH"]
    env.update(extra)
    (run_dir / "scrubbed.json").write_text(json.dumps(removed))
    return env


def supervise(run_dir: Path) -> int:
    from ladder.runs.runner import RunRequest
    from ladder.runs.runner.local import LocalRunner

    req = json.loads((run_dir / REQUEST).read_text())
    pid = os.getpid()
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        signal.signal(sig, _cancel)
    _write_json(run_dir / SUPERVISOR, {"pid": pid, "start_ticks": _start_ticks(pid), "started_at": time.time()})
    t0 = time.time()
    result: dict[str, Any] = {"started_at": t0, "exit_code": None, "timed_out": False, "killed_by_signal": None,
                              "cancelled": None, "log_files": LOGS}
    try:
        env = _run_env(req, run_dir)
        request = RunRequest(argv=req["command"], cwd=Path(req["cwd"]), env=env, log_dir=run_dir,
                             timeout_s=float(req["timeout_s"]), grace_s=float(req.get("grace_s", 5.0)),
                             sandbox=req.get("sandbox", "none"), read_only=tuple(Path(p) for p in req["read_only"]),
                             writable=tuple(Path(p) for p in req["writable"]))
        outcome = LocalRunner().execute(request, lambda stream, line, t: None)
        result.update(started_at=outcome.started_at, ended_at=outcome.ended_at, exit_code=outcome.exit_code,
                      timed_out=outcome.timed_out, killed_by_signal=outcome.killed_by_signal, pid=outcome.pid)
    except Cancelled as e:
        time.sleep(0.5)  # the runner killed the tree; let its log threads write the last lines
        result.update(ended_at=time.time(), cancelled=str(e))
    except Exception as e:  # recorded, not lost: the caller reads exit.json
        result.update(ended_at=time.time(), error=f"{type(e).__name__}: {e}")
    _write_json(run_dir / EXIT, result)
    return 0


# -------------------------------------------------------------------------------------------- follow

def follow(run_dir: Path, offsets: dict[str, int], prefix: bytes = b"") -> None:
    """Framed lines on stdout: `O <end offset> <log line>` (stdout.log), `E ...` (stderr.log), `H <time>` now
    and then, and last `X <exit json>` or `L <status json>` when the run was lost; each after `prefix`."""
    raw = sys.stdout.buffer

    class _Prefixed:
        def write(self, data: bytes) -> None:
            raw.write(prefix + data)

        def flush(self) -> None:
            raw.flush()

    out = _Prefixed() if prefix else raw
    beat = 0.0
    while True:
        st = status(run_dir)
        wrote = False
        for stream, name in LOGS.items():
            try:
                with open(run_dir / name, "rb") as f:
                    f.seek(offsets[stream])
                    data = f.read()
            except FileNotFoundError:
                continue
            end = data.rfind(b"\n")
            if end < 0:
                continue
            pos = offsets[stream]
            for line in data[: end + 1].splitlines(keepends=True):
                pos += len(line)
                out.write(TAGS[stream] + b" %d " % pos + line)
            offsets[stream] = pos
            wrote = True
        if st["state"] == "finished" and not wrote:
            out.write(b"X " + json.dumps(st["exit"]).encode() + b"\n")
            out.flush()
            return
        if st["state"] in ("lost", "absent") and not wrote:
            out.write(b"L " + json.dumps(st).encode() + b"\n")
            out.flush()
            return
        now = time.time()
        if now - beat > HEARTBEAT_S:
            out.write(b"H %.3f\n" % now)
            beat = now
        out.flush()
        if not wrote:
            time.sleep(POLL_S)


# ---------------------------------------------------------------------------------------------- kill

def kill(run_dir: Path, grace_s: float) -> dict[str, Any]:
    from ladder.runs.runner.tree import kill_recorded

    st = status(run_dir)
    if st["state"] != "running":
        return st
    pid = int(st["supervisor"]["pid"])
    os.kill(pid, signal.SIGTERM)
    end = time.time() + grace_s + 5.0
    while time.time() < end and status(run_dir)["state"] == "running":
        time.sleep(0.05)
    if status(run_dir)["state"] == "running":
        os.kill(pid, signal.SIGKILL)
    kill_recorded(run_dir)  # whatever the supervisor could not reach
    if not (run_dir / EXIT).exists():
        _write_json(run_dir / EXIT, {"started_at": None, "ended_at": time.time(), "exit_code": None,
                                     "timed_out": False, "killed_by_signal": signal.SIGKILL, "cancelled": "SIGKILL",
                                     "log_files": LOGS})
    return status(run_dir)


# ----------------------------------------------------------------------------------------------- job

JOB_PREFIX = b"@ladder "
PYTHON_MARK, RUN_DIR_MARK = "@LADDER_PYTHON@", "@LADDER_RUN_DIR@"
COLLECT = ["stdout.log", "stderr.log", "probe", "pids.json", "exit.json", "supervisor.json", "agent.log",
           "scrubbed.json"]


def _home(value: str) -> str:
    return os.path.expanduser(value) if value.startswith("~/") else value


def _fill(value: str, python: str, run_dir: Path) -> str:
    import shlex

    return value.replace(PYTHON_MARK, shlex.quote(python)).replace(RUN_DIR_MARK, shlex.quote(str(run_dir)))


def job(spec: dict[str, Any]) -> int:
    """One run as a SkyPilot job: everything on stdout, which SkyPilot keeps and `sky.tail_logs` streams."""
    import base64
    import io
    import shutil

    out = sys.stdout.buffer
    prepared = prepare(spec["prepare"])
    out.write(JOB_PREFIX + b"P " + json.dumps(prepared).encode() + b"\n")
    out.flush()
    if prepared.get("error"):
        return 3
    run_dir = Path(os.path.expanduser(spec["run_dir"]))
    if not (run_dir / REQUEST).exists():  # a job SkyPilot retried finds its run there: never twice
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.copytree(os.getcwd(), run_dir / "work", symlinks=True)
        req = dict(spec["start"])
        req["command"] = _fill(req["command"], prepared["python"], run_dir)
        req["env"] = {k: _home(v.replace(RUN_DIR_MARK, str(run_dir))) for k, v in req["env"].items()}
        req.update(cwd=str(run_dir / "work"), sandbox=prepared["sandbox"], read_only=prepared["read_only"],
                   writable=[str(run_dir)])
        _write_json(run_dir / REQUEST, req)
        # a child in the job's process group: SkyPilot's cancel signals it, and it kills the run's tree
        subprocess.Popen([sys.executable, os.path.abspath(__file__), "supervise", str(run_dir)], cwd=run_dir,
                         stdin=subprocess.DEVNULL, stdout=open(run_dir / AGENT_LOG, "ab"), stderr=subprocess.STDOUT,
                         env={k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "LADDER_JOB")})
    follow(run_dir, {"stdout": 0, "stderr": 0}, JOB_PREFIX)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name in COLLECT:
            if (run_dir / name).exists():
                tar.add(run_dir / name, arcname=name)
    data = base64.b64encode(buf.getvalue())
    for i in range(0, len(data), 4096):
        out.write(JOB_PREFIX + b"F " + data[i:i + 4096] + b"\n")
    out.write(JOB_PREFIX + b"F end\n")
    out.flush()
    shutil.rmtree(run_dir / "work", ignore_errors=True)
    done = _read_json(run_dir / EXIT) or {}
    return 0 if done.get("exit_code") == 0 else 1


# ------------------------------------------------------------------------------------------ transfer

def pack(root: Path, names: list[str]) -> None:
    with tarfile.open(fileobj=sys.stdout.buffer, mode="w|gz") as tar:
        for name in names:
            if (root / name).exists():
                tar.add(root / name, arcname=name)


def unpack(dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tarfile.open(fileobj=sys.stdin.buffer, mode="r|gz") as tar:
        for member in tar:
            if member.name.startswith(("/", "..")) or "/../" in member.name:
                raise SystemExit(f"refusing to unpack {member.name!r} outside {dest}")
            tar.extract(member, dest)
    _reply({"unpacked": str(dest)})


def main(argv: list[str]) -> int:
    cmd, args = argv[0], argv[1:]
    if cmd == "clock":  # ping-pong over one open channel: both legs of each round trip cost the same
        for _ in sys.stdin:
            _reply({"time": time.time()})
        return 0
    if cmd == "prepare":
        reply = prepare(json.loads(sys.stdin.read()))
        _reply(reply)
        return PREPARE_REFUSED if reply.get("error") else 0
    if cmd == "job":
        return job(json.loads(os.environ["LADDER_JOB"]))
    run_dir = Path(os.path.expanduser(args[0])).resolve()
    if cmd == "start":
        _reply(start(run_dir, json.loads(sys.stdin.read())))
    elif cmd == "supervise":
        return supervise(run_dir)
    elif cmd == "follow":
        follow(run_dir, {"stdout": int(args[1]), "stderr": int(args[2])})
    elif cmd == "status":
        _reply(status(run_dir))
    elif cmd == "kill":
        _reply(kill(run_dir, float(args[1])))
    elif cmd == "pack":
        pack(run_dir, args[1:])
    elif cmd == "unpack":
        unpack(run_dir)
    else:
        print(f"unknown command {cmd!r}", file=sys.stderr)
        return 2
    return 0


if __name__ == "__main__":
    # Run as a script from the shipped bundle: the bundle's root (holding `ladder/`) is the import path,
    # not this file's directory, and nothing from the caller's PYTHONPATH.
    sys.path[0] = str(Path(__file__).resolve().parents[3])
    sys.exit(main(sys.argv[1:]))
