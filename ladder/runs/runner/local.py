"""Run a command on this machine, sandboxed when asked, capturing output with timestamps.

Each stream is read in its own thread with a bounded `readline`, so neither a line with no newline nor a
multi-GB log grows memory; lines are written to `<stream>.log` prefixed with seconds since start, and
handed to the sink. The run gets its own process group and session, dies with ladder (the parent-death
signal, and under bubblewrap its PID namespace), and its whole tree (ladder.runs.runner.tree) is killed on
timeout, on cancellation and at the end, so no descendant outlives the run.
"""

from __future__ import annotations

import ctypes
import os
import signal
import subprocess
import threading
import time
from typing import BinaryIO

from ladder.runs.runner import LineSink, RunOutcome, RunRequest, command_argv
from ladder.runs.runner.sandbox import Sandbox, bwrap_argv
from ladder.runs.runner.tree import PIDS_FILE, ProcessTree, become_subreaper

READ_LIMIT = 64 * 1024  # bytes per read line; longer lines arrive in pieces
PR_SET_PDEATHSIG = 1


def _die_with_parent() -> None:
    # If ladder itself is SIGKILLed, the run must not live on as an orphan.
    try:
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
    except OSError:
        pass


class LocalRunner:
    name = "local"

    def execute(self, request: RunRequest, on_line: LineSink) -> RunOutcome:
        request.log_dir.mkdir(parents=True, exist_ok=True)
        logs = {"stdout": "stdout.log", "stderr": "stderr.log"}
        argv = command_argv(request.argv) if isinstance(request.argv, str) else list(request.argv)
        env = dict(request.env)
        if request.sandbox == "bwrap":
            box = Sandbox("bwrap", tuple(request.read_only), tuple(request.writable))
            argv = bwrap_argv(box, request.cwd, env) + argv
        become_subreaper()
        t0 = time.time()
        proc = subprocess.Popen(argv, cwd=request.cwd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                stderr=subprocess.PIPE, start_new_session=True, preexec_fn=_die_with_parent)
        tree = ProcessTree(proc.pid, record=request.log_dir / PIDS_FILE)
        lock = threading.Lock()

        def pump(stream: str, pipe: BinaryIO) -> None:
            # unbuffered: each line is on disk as it comes (a killed ladder loses nothing, and a follower
            # reading the log by byte offsets, as the ssh runner does, sees a line the moment it is printed)
            with open(request.log_dir / logs[stream], "wb", buffering=0) as out:
                for raw in iter(lambda: pipe.readline(READ_LIMIT), b""):
                    t = time.time() - t0
                    out.write(f"{t:.3f}\t".encode() + raw + (b"" if raw.endswith(b"\n") else b"\n"))
                    text = raw.decode("utf-8", errors="replace").rstrip("\r\n")
                    with lock:
                        on_line(stream, text, t)

        threads = [threading.Thread(target=pump, args=(s, p), daemon=True)
                   for s, p in (("stdout", proc.stdout), ("stderr", proc.stderr))]
        for th in threads:
            th.start()
        timed_out = False
        try:
            proc.wait(timeout=request.timeout_s)
        except subprocess.TimeoutExpired:
            timed_out = True
            tree.kill(request.grace_s)
            proc.wait()
        finally:
            if proc.poll() is None:  # interrupted (Ctrl-C, SIGTERM): take the run down with us
                tree.kill(0.5)
                proc.wait()
        ended = time.time()
        # Descendants that outlive the main process would hold the pipes open and the accelerator busy.
        tree.kill(1.0 if tree.alive() else 0.0)
        tree.stop()
        for th in threads:
            th.join(timeout=5.0)
        rc = proc.returncode
        return RunOutcome(exit_code=rc, started_at=t0, ended_at=ended, timed_out=timed_out,
                          killed_by_signal=-rc if rc is not None and rc < 0 else None, log_files=logs, pid=proc.pid)
