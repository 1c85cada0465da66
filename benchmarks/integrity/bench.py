"""Integrity benchmark: a supervised migration killed at random points, commands run two at a time, and a
hostile agent; does the evidence stay true?

Usage (from the repository root, with ladder installed; about 20-40 minutes on 2 cores):
    python3 benchmarks/integrity/bench.py [--kills 5] [--pairs 5] [--seed 0]

It uses the supervisor tests' fixture (tests/fixtures/supervised: a tiny torch repo whose attempt 0 crashes,
and scripted migrations) with the real CLI and real processes. It prints, per part:
- SIGKILL points: `ladder supervise` killed with SIGKILL at a random moment, then `ladder resume` until the
  migration ends; runs lost (an attempt that never got its judged run), runs duplicated (a judged run
  recorded twice), journal verify failures, orphans left (processes of the workspace still alive);
- concurrent pairs: two writing commands started together in one workspace; both accepted (bad), one
  refused with "workspace busy" (good), verify failures, orphans;
- hostile escapes: the share of a hostile agent's escapes that were stopped (blocked, failed the attempt,
  or caught by verify), with and without the sandbox;
- the writer lock's cost per command, and the integrity snapshot's cost per run.
Goals: 0 / 0 / 0 / 0, every escape stopped.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FIXTURE = ROOT / "tests" / "fixtures" / "supervised"
sys.path.insert(0, str(ROOT))

from ladder.journal.store import Journal, verify_journal  # noqa: E402

GIT_ID = {"GIT_AUTHOR_NAME": "bench", "GIT_AUTHOR_EMAIL": "b@b", "GIT_COMMITTER_NAME": "bench",
          "GIT_COMMITTER_EMAIL": "b@b"}
ENV = {**os.environ, **GIT_ID, "LADDER_PLAIN": "1"}


def ladder(ws: Path, *args: str, timeout: float = 3600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ladder", *args], cwd=ws, env=ENV, capture_output=True, text=True,
                          timeout=timeout)


def workspace(dst: Path, baselines: Path | None) -> Path:
    shutil.copytree(FIXTURE, dst, ignore=shutil.ignore_patterns("__pycache__"))
    for cmd in (["git", "init", "-q", "-b", "main"], ["git", "add", "-A"], ["git", "commit", "-q", "-m", "original"]):
        subprocess.run(cmd, cwd=dst / "repo", check=True, capture_output=True, env=ENV)
    if baselines is not None:
        shutil.copytree(baselines, dst / "baselines")
    return dst


def orphans(ws: Path) -> list[int]:
    """Processes still running code from this workspace's runs."""
    out = []
    for d in os.listdir("/proc"):
        if not d.isdigit() or int(d) == os.getpid():
            continue
        try:
            cmd = Path(f"/proc/{d}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            cwd = os.readlink(f"/proc/{d}/cwd")
        except OSError:
            continue
        if str(ws) in cmd or cwd.startswith(str(ws)):
            out.append(int(d))
    return out


def audit(ws: Path) -> dict[str, int]:
    j = Journal(ws / "journals" / "supervised" / "journal.sqlite")
    runs = j.entries("run")
    judged = [(e.attempt, e.content["kind"]) for e in runs if not e.content.get("killed_by_supervisor_crash")]
    attempts = {e.attempt for e in j.entries("attempt")}
    rejected = {e.attempt for e in j.entries("attempt_result") if e.content.get("rejected")}
    lost = len([n for n in attempts - rejected if (n, "short") not in judged])
    dup = len(judged) - len(set(judged))
    ok = verify_journal(j.path, root=ws).ok
    j.close()
    return {"lost": lost, "duplicated": dup, "verify_failures": 0 if ok else 1, "orphans": len(orphans(ws))}


def resume_to_end(ws: Path, limit: int = 8) -> None:
    for _ in range(limit):
        st = ladder(ws, "status", "--json", "--allow-unverified")
        if st.returncode == 0 and json.loads(st.stdout).get("finished"):
            return
        w = json.loads(st.stdout).get("waiting_for") if st.returncode == 0 else None
        args = ["resume"] + (["--decision", "continue"] if w and w.get("waiting_for") != "human" else [])
        ladder(ws, *args)


def kills(base: Path, baselines: Path, n: int, rng: random.Random, duration: float) -> list[dict]:
    out = []
    for i in range(n):
        ws = workspace(base / f"kill{i}", baselines)
        at = rng.uniform(0.05, 0.95) * duration
        proc = subprocess.Popen([sys.executable, "-m", "ladder", "supervise", "--agent", "scripted:migrations/e2e.toml"],
                                cwd=ws, env=ENV, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            proc.wait(timeout=at)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        resume_to_end(ws)
        res = {"kill_at_s": round(at, 1), **audit(ws)}
        print(f"  kill {i + 1}/{n} at {res['kill_at_s']} s: {res}", flush=True)
        out.append(res)
    return out


PAIRS = [("supervise", ["supervise", "--agent", "scripted:migrations/faithful.toml"], ["resume"]),
         ("baseline", ["baseline", "--force", "--seeds", "3", "--short-only"], ["baseline", "--force", "--seeds", "3",
                                                                             "--short-only"]),
         ("run", ["run", "--on", "target"], ["baseline", "extend", "--seeds", "4"])]


def pairs(base: Path, baselines: Path, n: int) -> list[dict]:
    out = []
    for i in range(n):
        name, first, second = PAIRS[i % len(PAIRS)]
        ws = workspace(base / f"pair{i}", baselines)
        a = subprocess.Popen([sys.executable, "-m", "ladder", *first], cwd=ws, env=ENV, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True)
        deadline = time.time() + 60
        while not (ws / ".ladder" / "lock.json").exists() and a.poll() is None and time.time() < deadline:
            time.sleep(0.05)
        b = ladder(ws, *second)
        a.communicate(timeout=3600)
        refused = (a.returncode == 2 and "workspace busy" in (a.stderr or "")) or (
            b.returncode == 2 and "workspace busy" in b.stderr)
        both = a.returncode == 0 and b.returncode == 0
        j = ws / "journals" / "supervised" / "journal.sqlite"
        ok = verify_journal(j, root=ws).ok if j.exists() else True
        if (ws / "baselines").exists():
            from ladder.baselines.store import verify_baseline, versions
            from ladder.migration.spec import load_spec

            ok = ok and not any(verify_baseline(v) for v in versions(load_spec(ws / "ladder.toml")))
        res = {"pair": name, "both_accepted": both, "refused": refused, "verify_failures": 0 if ok else 1,
               "orphans": len(orphans(ws))}
        print(f"  pair {i + 1}/{n} ({name}): {res}", flush=True)
        out.append(res)
    return out


def hostile(base: Path, baselines: Path) -> dict[str, str]:
    """Runs the supervisor tests' hostile-agent test in both sandbox modes and reports its outcome."""
    p = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                        str(ROOT / "tests" / "test_supervisor.py"), "-k", "hostile"], cwd=ROOT, env=ENV,
                       capture_output=True, text=True, timeout=7200)
    return {"result": p.stdout.strip().splitlines()[-1] if p.stdout.strip() else p.stderr[-300:]}


def lock_cost(base: Path) -> tuple[float, float]:
    from ladder.migration.spec import load_spec
    from ladder.migration.workspace import WorkspaceLock, protected_state

    ws = base / "lock"
    ws.mkdir()
    t0 = time.perf_counter()
    for _ in range(200):
        with WorkspaceLock(ws, "bench"):
            pass
    lock_ms = (time.perf_counter() - t0) / 200 * 1e3
    spec = load_spec(base / "kill0" / "ladder.toml") if (base / "kill0").exists() else None
    snap = []
    if spec is not None:
        for _ in range(20):
            t = time.perf_counter()
            protected_state(spec)
            snap.append(time.perf_counter() - t)
    return lock_ms, (statistics.median(snap) * 1e3 if snap else float("nan"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kills", type=int, default=5)
    ap.add_argument("--pairs", type=int, default=6)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-hostile", action="store_true")
    args = ap.parse_args()
    rng = random.Random(args.seed)
    base = Path(tempfile.mkdtemp(prefix="ladder-integrity-"))
    t0 = time.time()
    seed_ws = workspace(base / "seed", None)
    p = ladder(seed_ws, "baseline", "--seeds", "3", "--full-seeds", "1")
    assert p.returncode == 0, p.stderr
    baselines = seed_ws / "baselines"
    ref = workspace(base / "uninterrupted", baselines)
    t = time.time()
    ladder(ref, "supervise", "--agent", "scripted:migrations/e2e.toml")
    duration = time.time() - t
    print(f"uninterrupted supervised migration: {duration:.0f} s; {audit(ref)}", flush=True)
    k = kills(base, baselines, args.kills, rng, duration)
    pr = pairs(base, baselines, args.pairs)
    h = {} if args.no_hostile else hostile(base, baselines)
    lock_ms, snap_ms = lock_cost(base)
    total = lambda key, rows: sum(r[key] for r in rows)  # noqa: E731
    print()
    print(f"SIGKILL points ({len(k)}): runs lost {total('lost', k)}, runs duplicated {total('duplicated', k)}, "
          f"verify failures {total('verify_failures', k)}, orphans left {total('orphans', k)}  (goal 0/0/0/0)")
    print(f"concurrent pairs ({len(pr)}): both accepted {sum(r['both_accepted'] for r in pr)}, refused with "
          f"'workspace busy' {sum(r['refused'] for r in pr)}, verify failures {total('verify_failures', pr)}, "
          f"orphans left {total('orphans', pr)}")
    if h:
        print(f"hostile agent (6 escapes, sandbox and none): {h['result']}")
    print(f"writer lock: {lock_ms:.3f} ms per command; integrity snapshot: {snap_ms:.1f} ms per run or agent step")
    print(f"wall {(time.time() - t0) / 60:.1f} min; work dir {base}")


if __name__ == "__main__":
    main()
