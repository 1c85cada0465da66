"""ladder's own overhead per run (capture + parse + check), as a ratio to the example's training time.

Interleaves, N times: the example's short run started directly (subprocess, output to a pipe that is
drained), and the same run through ladder (execute_run with the probe, then the L0-L2 checks). Prints
the medians and the ratio (ladder - direct) / direct, measured in this one invocation.

    python benchmarks/run_overhead.py [--repeats 5] [--steps 300]
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from ladder.checks import CheckContext, run_ladder  # noqa: E402
from ladder.migration.protocol import load_protocol  # noqa: E402
from ladder.runs.execute import execute_run  # noqa: E402
from ladder.migration.spec import load_spec  # noqa: E402


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--steps", type=int, default=300)
    args = ap.parse_args()
    work = Path(tempfile.mkdtemp(prefix="ladder-overhead-"))
    shutil.copytree(REPO / "examples" / "classifier" / "repo", work / "repo")
    spec_text = (REPO / "examples" / "classifier" / "ladder.toml").read_text()
    # The reference profile runs on this interpreter (it must have torch); no env build in the timing.
    head, _, tail = spec_text.partition("[profiles.reference]")
    ref = ('[profiles.reference]\nplatform = "cpu"\npython = "' + sys.executable + '"\n'
           'env = { OMP_NUM_THREADS = "1" }\nvars = { device = "cpu" }\nprice_per_hour = 1.0\n\n')
    (work / "ladder.toml").write_text(head + ref + "[profiles.target]" + tail.split("[profiles.target]", 1)[1])
    spec = load_spec(work / "ladder.toml")
    protocol = load_protocol()
    cmd = [sys.executable, "train.py", "--seed", "0", "--steps", str(args.steps), "--eval-every", "100",
           "--device", "cpu"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    direct, ladder, checks = [], [], []
    for i in range(args.repeats):
        t0 = time.perf_counter()
        subprocess.run(cmd, cwd=work / "repo", env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, check=True)
        direct.append(time.perf_counter() - t0)
        t0 = time.perf_counter()
        rec = execute_run(spec, "reference", "short", 0, run_dir=work / f"run{i}")
        t1 = time.perf_counter()
        run_ladder(CheckContext(run=rec, protocol=protocol, expected_platform="cpu"), up_to="L2")
        t2 = time.perf_counter()
        ladder.append(t2 - t0)
        checks.append(t2 - t1)
        print(f"repeat {i + 1}: direct {direct[-1]:.2f} s, through ladder {ladder[-1]:.2f} s "
              f"(checks {checks[-1] * 1000:.1f} ms)", flush=True)
    d, l_ = statistics.median(direct), statistics.median(ladder)
    print(f"\nmedian training run, direct:        {d:.3f} s")
    print(f"median same run through ladder:     {l_:.3f} s  (capture + parse + probe + run.json + manifest + checks)")
    print(f"median checks alone:                {statistics.median(checks) * 1000:.1f} ms")
    print(f"overhead ratio (ladder - direct) / direct: {(l_ - d) / d:+.3f}")
    shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
