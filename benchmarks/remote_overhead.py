"""What the ssh runner costs per run: connect, environment check, code sync, start and collection, and the
ratio of a whole ssh run to a local run of the example (examples/classifier's reference profile, torch on CPU).

Run:  python benchmarks/remote_overhead.py [--steps 150] [--repeats 2] [--host ALIAS]
Without --host it starts a throwaway sshd on 127.0.0.1 (tests/sshd.py: Debian's openssh-server, a generated key)
so the "machine" is this one reached through ssh, with its own root directory; its environment cache is this
machine's ladder cache (the reference environment built once is reused, as on a machine that ran before).
Local and ssh runs alternate so that load drift hits both alike; each figure is the median over the repeats.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests"))
from ladder.migration.spec import load_spec  # noqa: E402
from ladder.runs.envs import cache_root  # noqa: E402
from ladder.runs.execute import execute_run  # noqa: E402


def workspace(tmp: Path, steps: int, ssh_table: str) -> Path:
    ws = tmp / "ws"
    shutil.copytree(ROOT / "examples" / "classifier" / "repo", ws / "repo", ignore=shutil.ignore_patterns("__pycache__"))
    text = (ROOT / "examples" / "classifier" / "ladder.toml").read_text()
    text = text.replace('source = "repo"', 'source = "repo"').replace("short_steps = 300", f"short_steps = {steps}")
    start = text.index("[profiles.reference]")
    end = text.index("[profiles.target]")
    reference = text[start:end]
    remote = reference.replace("[profiles.reference]", f'[profiles.remote]\nrunner = "ssh"\nssh = {ssh_table}')
    (ws / "ladder.toml").write_text(text[:end] + remote + text[end:])
    return ws


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=150)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--host", help="an ssh host alias to use instead of a throwaway local sshd")
    args = ap.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="ladder-remote-bench-"))
    server = None
    if args.host:
        table = f'{{ host = "{args.host}" }}'
    else:
        from sshd import start_sshd

        server = start_sshd(tmp / "sshd")
        if isinstance(server, str):
            sys.exit(f"cannot start a local sshd: {server}")
        table = server.profile_table(cache=str(cache_root()))
    try:
        ws = workspace(tmp, args.steps, table)
        spec = load_spec(ws / "ladder.toml")
        execute_run(spec, "reference", "short")  # warm both sides (environment, page cache, the agent's bundle)
        execute_run(spec, "remote", "short")
        local, remote, parts = [], [], {}
        for i in range(args.repeats):
            for profile in (("reference", "remote") if i % 2 == 0 else ("remote", "reference")):
                t0 = time.time()
                rec = execute_run(spec, profile, "short", seed=i)
                wall = time.time() - t0
                assert rec.exit_code == 0, rec.last_lines
                if profile == "reference":
                    local.append(wall)
                else:
                    remote.append(wall)
                    for k, v in {**rec.remote.timings, "run (on the machine)": rec.wall_s}.items():
                        parts.setdefault(k, []).append(v)
        med = {k: statistics.median(v) for k, v in parts.items()}
        out = {"steps": args.steps, "repeats": args.repeats, "local_run_s": statistics.median(local),
               "ssh_run_s": statistics.median(remote), "ratio_ssh_to_local": statistics.median(remote) /
               statistics.median(local), "ssh_parts_s": med,
               "ssh_overhead_s": statistics.median(remote) - med["run (on the machine)"]}
        print(f"local run of examples/classifier ({args.steps} steps): {out['local_run_s']:.2f} s")
        print(f"ssh run of the same:                          {out['ssh_run_s']:.2f} s   "
              f"ratio {out['ratio_ssh_to_local']:.3f}")
        for k in ("connect", "env", "sync", "start", "run (on the machine)", "collect"):
            if k in med:
                print(f"  {k:<22}{med[k]:8.3f} s")
        print(f"  overhead per run      {out['ssh_overhead_s']:8.3f} s (everything but the run itself)")
        print(json.dumps(out))
    finally:
        if server is not None:
            server.stop()
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    main()
