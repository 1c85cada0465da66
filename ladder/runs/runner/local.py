"""Run a command on this machine in its own process group, capturing output with timestamps.

Each stream is read in its own thread with a bounded `readline`, so neither a line with no newline
nor a multi-GB log grows memory; lines are written to `<stream>.log` prefixed with seconds since
start, and handed to the sink. On timeout the whole group gets SIGTERM, then SIGKILL after a grace
period, so children and grandchildren die with the run.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from typing import BinaryIO

from ladder.runs.runner import LineSink, RunOutcome, RunRequest

READ_LIMIT = 64 * 1024  # bytes per read line; longer lines arrive in pieces
PR_SET_PDEATHSIG = 1
FLUSH_EVERY_S = 0.2


def _die_with_parent() -> None:
    # If ladder itself is SIGKILLed, the run must not live on as an orphan.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


def _kill_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
        return True
    except (ProcessLookupError, PermissionError):
        return False


class LocalRunner:
    name = "local"

    def execute(self, request: RunRequest, on_line: LineSink) -> RunOutcome:
        request.log_dir.mkdir(parents=True, exist_ok=True)
        logs = {"stdout": "stdout.log", "stderr": "stderr.log"}
        t0 = time.time()
        proc = subprocess.Popen(
            request.argv,
            shell=isinstance(request.argv, str),
            cwd=request.cwd,
            env=request.env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        pgid = proc.pid
        lock = threading.Lock()

        def pump(stream: str, pipe: BinaryIO) -> None:
            flushed = 0.0
            with open(request.log_dir / logs[stream], "wb") as out:
                for raw in iter(lambda: pipe.readline(READ_LIMIT), b""):
                    t = time.time() - t0
                    out.write(f"{t:.3f}\t".encode() + raw + (b"" if raw.endswith(b"\n") else b"\n"))
                    if t - flushed > FLUSH_EVERY_S:  # if ladder is killed, the log is still on disk
                        out.flush()
                        flushed = t
                    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    with lock:
                        on_line(stream, text, t)
                out.flush()

        threads = [threading.Thread(target=pump, args=(s, p), daemon=True)
                   for s, p in (("stdout", proc.stdout), ("stderr", proc.stderr))]
        for th in threads:
            th.start()
        timed_out = False
        try:
            proc.wait(timeout=request.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            _kill_group(pgid, signal.SIGTERM)
            try:
                proc.wait(timeout=request.grace_s)
            except subprocess.TimeoutExpired:
                pass
            _kill_group(pgid, signal.SIGKILL)
            proc.wait()
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C): take the run down with us
                _kill_group(pgid, signal.SIGKILL)
                proc.wait()
        ended = time.time()
        # Children that outlive the main process would hold the pipes open forever.
        for th in threads:
            th.join(timeout=request.grace_s if not timed_out else 1.0)
        if _group_alive(pgid):
            _kill_group(pgid, signal.SIGKILL)
        for th in threads:
            th.join(timeout=5.0)
        rc = proc.returncode
        return RunOutcome(
            exit_code=rc,
            started_at=t0,
            ended_at=ended,
            timed_out=timed_out,
            killed_by_signal=-rc if rc is not None and rc < 0 else None,
            log_files=logs,
        )
