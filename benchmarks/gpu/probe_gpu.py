"""The probe on a GPU: a PyTorch reference on CUDA against its JAX port on the GPU, each run with and without
the probe, measured the same way on both sides.

    python3 benchmarks/gpu/probe_gpu.py --out OUT            # on a machine with torch (CUDA) and jax (CUDA)
    python3 benchmarks/gpu/probe_gpu.py --cpu --out OUT      # the same plan on this CPU machine (ladder's
                                                             # environment cache: torch 2.13 CPU, jax CPU)

The program is the port corpus's `charlm` (a tiny GPT, nanoGPT's habits: the loss read with `.item()` every
step, periodic and final evaluation; benchmarks/ports/charlm). Its reference runs with `--device cuda`; the JAX
variants pick the GPU by themselves. Every run goes through ladder's own `execute_run`; a run "without the
probe" is the same call with `probe=False` (same copy, scrub, sandbox and parsing), so only the probe differs.

What it prints and writes (OUT/results.json, OUT/report.md):
- host reads per training step on both sides, counted by the probe (the reference's own `.item()` included);
- compiles: the probe's count and JAX's own log (`JAX_LOG_COMPILES=1`, set with and without the probe), by
  function, so that a graph the probe added or changed would show;
- median step time with and without the probe (the loss lines' times, the first interval skipped), sequential
  pairs in alternating order, and how far the loss curves of the two runs differ;
- ladder's verdicts (calibrated + L2, as the supervisor judges: short up to L2, full up to L4) for two faithful
  ports and two planted faults, against a baseline of the reference's own runs on the same machine.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import re
import statistics
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
PROGRAM = ROOT / "benchmarks" / "ports" / "charlm"
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "benchmarks" / "detection"))

from ladder.checks import CheckContext, run_ladder  # noqa: E402
from ladder.migration.spec import load_spec, load_spec_protocol  # noqa: E402
from ladder.runs.execute import execute_run  # noqa: E402
from ladder.runs.probe_report import read_rates  # noqa: E402
from ladder.runs.records import RunRecord  # noqa: E402

# (variant, kind, what it is here)
PORTS = [("jax_chain", "faithful", "optax.chain(clip, adamw with a decay mask)"),
         ("jax_multi", "faithful", "optax.multi_transform: decay and no-decay branches"),
         ("jax_static_step", "fault", "the rate injected through a static argument: a compile every step"),
         ("jax_host_snapshot", "fault", "jax.device_get(params) after every step: a host copy per step")]
# ladder's own packages may come from a folder on PYTHONPATH (wheels carried to a bare GPU machine): the runs must
# not see them, so that each program runs with its own interpreter's packages only (this process keeps its path)
os.environ.pop("PYTHONPATH", None)
COMPILE_LINE = re.compile(r"Finished XLA compilation of (?P<fn>\S+) in ")


def write_spec(ws: Path, cpu: bool, torch_py: str, jax_py: str) -> Path:
    corpus = tomllib.loads((PROGRAM / "corpus.toml").read_text())
    s = corpus["spec"]
    device = "cpu" if cpu else "cuda"
    parse = "".join(f"{k} = {json.dumps(v)}\n" for k, v in s["parse"].items())
    jax_env = {"OMP_NUM_THREADS": "1", "JAX_LOG_COMPILES": "1"}
    if not cpu:
        jax_env["XLA_PYTHON_CLIENT_PREALLOCATE"] = "false"  # several runs share the GPU in the second phase
    env = lambda d: "{ " + ", ".join(f"{k} = {json.dumps(v)}" for k, v in d.items()) + " }"  # noqa: E731
    text = f'''name = "charlm-gpu"
source = "reference"
protocol = "ncsu"

[experiment]
short = {json.dumps(s["short"])}
full = {json.dumps(s["full"])}
short_steps = {s["short_steps"]}
full_steps = {s["full_steps"]}
expected_minutes_short = {s["expected_minutes_short"]}
expected_minutes_full = {s["expected_minutes_full"]}

[parse]
{parse}
[profiles.reference]
platform = "{device}"
python = {json.dumps(torch_py)}
short = {json.dumps(s["short"] + " --device " + device)}
full = {json.dumps(s["full"] + " --device " + device)}
env = {env({"OMP_NUM_THREADS": "1"})}
price_per_hour = 3.5
chips = 1
'''
    for name in ["target"] + [f"v_{n}" for n, _, _ in PORTS]:  # the spec needs a target; the variants are its kin
        text += f'''
[profiles.{name}]
platform = "{"jax-cpu" if cpu else "jax-gpu"}"
python = {json.dumps(jax_py)}
env = {env(jax_env)}
price_per_hour = 3.5
chips = 1
'''
    ws.mkdir(parents=True, exist_ok=True)
    if not (ws / "reference").exists():
        (ws / "reference").symlink_to(PROGRAM / "reference")
    (ws / "ladder.toml").write_text(text)
    return ws / "ladder.toml"


def run(spec_path: Path, profile: str, kind: str, seed: int, run_dir: Path, probe: bool = True) -> RunRecord:
    spec = load_spec(spec_path)
    source = PROGRAM / ("reference" if profile == "reference" else f"variants/{profile[2:]}")
    t = time.time()
    rec = execute_run(spec, profile, kind, seed, source=source, run_dir=run_dir, probe=probe)
    print(f"  {profile} {kind} s{seed} probe={'on' if probe else 'off'}: exit {rec.exit_code} metric {rec.metric} "
          f"({time.time() - t:.1f} s)" + (f": {' | '.join((rec.error_lines or rec.last_lines)[-3:])[:400]}"
                                          if rec.exit_code else ""), flush=True)
    return rec


def step_ms(rec: RunRecord) -> float | None:
    """Milliseconds per training step: the time between the loss lines of the last 90% of the logged steps over
    the steps they span, intervals that hold an evaluation left out (run.json's line times have 0.1 ms
    resolution; a median of single intervals would round a 1.5 ms step to the millisecond)."""
    pts = rec.loss_curve
    evals = sorted(e.t for e in rec.evals)
    first = pts[0].step + (pts[-1].step - pts[0].step) // 10 if pts else 0
    dt = dn = 0.0
    for a, b in zip(pts, pts[1:]):
        if a.step >= first and b.step > a.step and not any(a.t <= t <= b.t for t in evals):
            dt, dn = dt + b.t - a.t, dn + b.step - a.step
    return dt / dn * 1e3 if dn else None


def log_compiles(rec: RunRecord, run_dir: Path) -> dict[str, dict[str, int]]:
    """JAX's own compile log (JAX_LOG_COMPILES=1), by function, independent of the probe: {"run": compiles up to
    the metric line, "exit": those after it (the probe evaluates an optax schedule at exit)}."""
    end = max([p.t for p in rec.loss_curve] + [e.t for e in rec.evals] or [float("inf")])
    out: dict[str, dict[str, int]] = {"run": {}, "exit": {}}
    for name in rec.log_files.values():
        for line in (run_dir / name).read_text(errors="replace").splitlines():
            t, _, text = line.partition("\t")
            m = COMPILE_LINE.search(text)
            if m:
                part = out["exit" if float(t) > end else "run"]
                part[m["fn"]] = part.get(m["fn"], 0) + 1
    return out


def probe_facts(rec: RunRecord) -> dict[str, Any]:
    p = rec.probe or {}
    rates = read_rates(rec) or []
    worst = max(rates, key=lambda r: r.per_step, default=None)
    return {"platforms": p.get("platforms"), "compiles": (p.get("compiles") or {}).get("jax"),
            "host_reads_per_step": round(worst.per_step, 3) if worst else None,
            "host_reads": worst.describe() if worst else None,
            "grad_norms_recorded": len((p.get("grad_norms") or {}).get("values") or []),
            "grad_norms_every": (p.get("grad_norms") or {}).get("every")}


def curve_diff(a: RunRecord, b: RunRecord) -> float | None:
    la, lb = {p.step: p.loss for p in a.loss_curve}, {p.step: p.loss for p in b.loss_curve}
    common = sorted(set(la) & set(lb))
    return max(abs(la[s] - lb[s]) for s in common) if common else None


def judge(rec: RunRecord, shorts: list[RunRecord], fulls: list[RunRecord], spec_path: Path, up_to: str,
          platform_name: str) -> dict[str, Any]:
    from bench import _baseline  # the detection benchmark's baseline from stored runs

    protocol = load_spec_protocol(load_spec(spec_path))
    ctx = CheckContext(run=rec, protocol=protocol, baseline=_baseline(Path("."), shorts, fulls),
                       expected_platform=platform_name, full_run=None, options={})
    res = run_ladder(ctx, up_to=up_to)
    return {"achieved": res.achieved_level,
            "checks": {f"{c.level}/{c.name}": c.status for c in res.checks},
            "failed": {f"{c.level}/{c.name}": (c.evidence or "")[:300] for c in res.checks
                       if c.status not in ("passed", "not_applicable")}}


def compare_pairs(timed: dict[tuple[str, bool], list[tuple[RunRecord, Path]]]) -> list[dict[str, Any]]:
    """Phase 1's figures for each side: its runs with the probe against its runs without."""
    rows = []
    for profile in ("reference", "v_jax_chain"):
        on, off = timed[(profile, True)], timed[(profile, False)]
        row = {"side": profile,
               "step_ms_probe": [step_ms(r) for r, _ in on],
               "step_ms_plain": [step_ms(r) for r, _ in off],
               "wall_s_probe": [r.wall_s for r, _ in on], "wall_s_plain": [r.wall_s for r, _ in off],
               "max_loss_diff": max((curve_diff(x, y) or 0.0) for (x, _), (y, _) in zip(on, off)),
               # the floor: two runs without the probe (a GPU's reductions need not be deterministic)
               "max_loss_diff_plain_plain": curve_diff(off[0][0], off[1][0]) if len(off) > 1 else None,
               "metric_probe": [r.metric for r, _ in on], "metric_plain": [r.metric for r, _ in off],
               "log_compiles_probe": [log_compiles(r, d) for r, d in on],
               "log_compiles_plain": [log_compiles(r, d) for r, d in off],
               "probe": probe_facts(on[0][0])}
        row["same_program_graphs"] = all(c["run"] == row["log_compiles_plain"][0]["run"]
                                         for c in row["log_compiles_probe"] + row["log_compiles_plain"])
        ratios = [p / q for p, q in zip(row["step_ms_probe"], row["step_ms_plain"]) if p and q]
        row["step_ratio"] = statistics.median(ratios) if ratios else None
        rows.append(row)
    return rows


def reread(runs: Path) -> list[dict[str, Any]]:
    """Phase 1's figures again from stored run directories (OUT/ws/runs, or runs.tgz unpacked): nothing runs."""
    timed: dict[tuple[str, bool], list[tuple[RunRecord, Path]]] = {}
    for d in sorted(runs.glob("*-short-s0-*-[0-9]*")):
        profile, mode = d.name.split("-short-s0-")[0], d.name.rsplit("-", 2)[-2]
        timed.setdefault((profile, mode == "probe"), []).append((RunRecord.load(d), d))
    return compare_pairs(timed)


def machine() -> dict[str, Any]:
    info: dict[str, Any] = {"host": platform.node(), "python": sys.version.split()[0]}
    try:
        info["gpu"] = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=30).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        info["gpu"] = None
    return info


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--out", type=Path, required=True)
    ap.add_argument("--cpu", action="store_true", help="plan on this CPU machine, ladder's cached environments")
    ap.add_argument("--torch-python", default="python3")
    ap.add_argument("--jax-python", default="python3")
    ap.add_argument("--pairs", type=int, default=2, help="with/without-probe pairs per side, alternating order")
    ap.add_argument("--short-seeds", type=int, default=5, help="the reference's short seeds besides seed 0")
    ap.add_argument("--full-seeds", type=int, default=3, help="the reference's full seeds besides seed 0")
    ap.add_argument("--jobs", type=int, default=3, help="runs at a time in the second phase (not timed)")
    ap.add_argument("--steps", type=int, default=0, help="override the short run's steps (a quick try)")
    ap.add_argument("--reread", type=Path, default=None,
                    help="a stored runs directory: recompute phase 1's table from it (with OUT/results.json), run nothing")
    a = ap.parse_args()
    if a.reread:
        results = json.loads((a.out / "results.json").read_text())
        results["pairs"] = reread(a.reread)
        (a.out / "results.json").write_text(json.dumps(results, indent=1, default=str))
        (a.out / "report.md").write_text(render(results))
        print(render(results))
        return
    if a.cpu and a.torch_python == "python3":
        sys.path.insert(0, str(ROOT / "benchmarks" / "detection"))
        from bench import _setups
        from ladder.runs.envs import ensure_env

        a.torch_python = ensure_env(_setups()["torch"]["setup"], _setups()["torch"]["python"]).python
        a.jax_python = ensure_env(_setups()["jax"]["setup"], _setups()["jax"]["python"]).python
    out = a.out.resolve()
    ws = out / "ws"
    spec_path = write_spec(ws, a.cpu, a.torch_python, a.jax_python)
    if a.steps:
        text = spec_path.read_text()
        spec_path.write_text(re.sub(r"short_steps = \d+", f"short_steps = {a.steps}", text))
    runs = ws / "runs"
    t0 = time.time()
    results: dict[str, Any] = {"machine": machine(), "cpu_plan": a.cpu, "pairs": []}

    # phase 1, timed and alone: the reference and the faithful port, with and without the probe
    print("phase 1: with and without the probe, one run at a time", flush=True)
    timed: dict[tuple[str, bool], list[tuple[RunRecord, Path]]] = {}
    for rep in range(a.pairs):
        for profile in ("reference", "v_jax_chain"):
            for probe in ((True, False) if rep % 2 == 0 else (False, True)):
                d = runs / f"{profile}-short-s0-{'probe' if probe else 'plain'}-{rep}"
                timed.setdefault((profile, probe), []).append((run(spec_path, profile, "short", 0, d, probe), d))
    results["pairs"] = compare_pairs(timed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))  # phase 1 kept if cut off

    # phase 2, not timed: the rest of the baseline and the ports' runs, a few at a time
    print(f"phase 2: the baseline and the ports, {a.jobs} at a time", flush=True)
    jobs = [("reference", "short", s) for s in range(1, a.short_seeds + 1)]
    jobs += [("reference", "full", s) for s in range(0, a.full_seeds + 1)]
    jobs += [("v_jax_chain", "full", 0)]
    jobs += [(f"v_{n}", "short", 0) for n, _, _ in PORTS[1:]]
    jobs += [("v_jax_multi", "full", 0)]
    with ThreadPoolExecutor(max_workers=a.jobs) as pool:
        recs = list(pool.map(lambda j: run(spec_path, j[0], j[1], j[2], runs / f"{j[0]}-{j[1]}-s{j[2]}"), jobs))
    by = {j: r for j, r in zip(jobs, recs)}
    ref0 = timed[("reference", True)][0][0]
    shorts = [by[("reference", "short", s)] for s in range(1, a.short_seeds + 1)]
    fulls = [by[("reference", "full", s)] for s in range(1, a.full_seeds + 1)]
    target = "jax-cpu" if a.cpu else "jax-gpu"
    verdicts = []
    for name, kind, what in PORTS:
        short = timed[("v_jax_chain", True)][0][0] if name == "jax_chain" else by[(f"v_{name}", "short", 0)]
        v = {"variant": name, "kind": kind, "what": what, "probe": probe_facts(short),
             "short": judge(short, shorts, fulls, spec_path, "L2", target)}
        full = by.get((f"v_{name}", "full", 0))
        if full is not None:
            v["full"] = judge(full, shorts, fulls, spec_path, "L4", target)
        verdicts.append(v)
    ref_self = {"short": judge(ref0, shorts, fulls, spec_path, "L2", "cpu" if a.cpu else "cuda"),
                "full": judge(by[("reference", "full", 0)], shorts, fulls, spec_path, "L4", "cpu" if a.cpu else "cuda")}
    results.update(verdicts=verdicts, reference_seed0=ref_self, wall_s=round(time.time() - t0, 1),
                   reference_probe=probe_facts(ref0))
    out.mkdir(parents=True, exist_ok=True)
    (out / "results.json").write_text(json.dumps(results, indent=1, default=str))
    report = render(results)
    (out / "report.md").write_text(report)
    print(report)


def _g(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def _n(logs: list[dict[str, dict[str, int]]]) -> str:
    return " / ".join(f"{sum(c['run'].values())} + {sum(c['exit'].values())}" for c in logs)


def render(r: dict[str, Any]) -> str:
    fmt = lambda xs: " / ".join("-" if x is None else f"{x:.3g}" for x in xs)  # noqa: E731
    lines = [f"machine: {r['machine']}", "", "| side | step ms, probe | step ms, without | ratio | wall s, probe | "
             "wall s, without | max loss diff (two runs without) | host reads/step (probe) | compiles: probe / JAX log with / without "
             "(while training + at exit) | the run's graphs the same |", "|---|---|---|---|---|---|---|---|---|---|"]
    for p in r["pairs"]:
        lc_on, lc_off = p["log_compiles_probe"], p["log_compiles_plain"]
        lines.append(f"| {p['side']} | {fmt(p['step_ms_probe'])} | {fmt(p['step_ms_plain'])} | "
                     f"{p['step_ratio'] and round(p['step_ratio'], 3)} | {fmt(p['wall_s_probe'])} | "
                     f"{fmt(p['wall_s_plain'])} | {p['max_loss_diff']:.3g} ({_g(p['max_loss_diff_plain_plain'])}) | {p['probe']['host_reads_per_step']} | "
                     f"{p['probe']['compiles']} / {_n(lc_on)} / {_n(lc_off)} | {p['same_program_graphs']} |")
    lines += ["", "| port | kind | host reads/step | compiles (probe) | short | full |", "|---|---|---|---|---|---|"]
    for v in r["verdicts"]:
        cell = lambda j: j and (str(j["achieved"] or "none") + ("; failed: " + ", ".join(j["failed"]) if j["failed"] else ""))  # noqa: E731
        lines.append(f"| {v['variant']} | {v['kind']} | {v['probe']['host_reads_per_step']} | "
                     f"{v['probe']['compiles']} | {cell(v['short'])} | {cell(v.get('full'))} |")
    rs = r["reference_seed0"]
    lines += ["", f"reference seed 0 against its other seeds: short {rs['short']['achieved']}, full "
                  f"{rs['full']['achieved']} ({', '.join(rs['full']['failed']) or 'nothing failed'})",
              f"wall: {r['wall_s']} s"]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
