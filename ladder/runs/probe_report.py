"""The ladder side of the injected probe: the environment that injects it, and the merge of its
per-process reports into one dict (stored as `RunRecord.probe`).

Owns: where the probe lives, how its reports are read and summarised for the L2 checks, and the
measures derived from them the same way for a run and for the baseline's runs (host reads per training
step, compilations after warm-up, evaluation items), so that checks compare like with like.
Must not: judge a run (that is ladder.checks.l2), or import any framework. The per-process reports
are kept whole under `processes`; the summaries are derived from them and can be recomputed.
"""

from __future__ import annotations

import bisect
import json
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ladder.runs.optimizers import timelines

if TYPE_CHECKING:
    from ladder.migration.protocol import L2Rules
    from ladder.runs.records import RunRecord

PROBE_DIR = Path(__file__).resolve().parent.parent / "probe"
MERGED_SCHEMA = 2


def probe_env(out_dir: Path, options: dict[str, Any] | None = None,
              pythonpath: str | None = None) -> dict[str, str]:
    """Env vars to add to a captured run: the probe first on PYTHONPATH, where reports go, options.
    `pythonpath` is the run's own PYTHONPATH (a profile's `env` may set one), kept after the probe;
    without it, this process's."""
    existing = os.environ.get("PYTHONPATH", "") if pythonpath is None else pythonpath
    env = {
        "PYTHONPATH": str(PROBE_DIR) + (os.pathsep + existing if existing else ""),
        "LADDER_PROBE_DIR": str(Path(out_dir).resolve()),
    }
    if options:
        env["LADDER_PROBE_OPTS"] = json.dumps(options, sort_keys=True)
    return env


def classify_aten(counters: dict[str, int], fallback_allow: list[str],
                  host_sync_ops: list[str]) -> dict[str, dict[str, int]]:
    """Split PyTorch/XLA `aten::*` counters: a host round-trip, an expected op, or a CPU fallback."""
    out: dict[str, dict[str, int]] = {"fallback": {}, "host_sync": {}, "allowed": {}}
    for name, n in sorted(counters.items()):
        kind = "host_sync" if name in host_sync_ops else "allowed" if name in fallback_allow else "fallback"
        out[kind][name] = out[kind].get(name, 0) + int(n)
    return out


def step_at(step_times: list[list[float]], t: float) -> int:
    """Optimizer steps begun by epoch time `t`, from a process's [[step, t], ...] record."""
    times = [x[1] for x in step_times]
    i = bisect.bisect_right(times, t)
    return 0 if i == 0 else int(step_times[i - 1][0])


def _read_reports(out_dir: Path) -> tuple[list[dict[str, Any]], list[str]]:
    reports, errors = [], []
    for path in sorted(out_dir.glob("probe-*.json")):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError) as e:
            errors.append(f"{path.name}: unreadable report ({e})")
            continue
        if not isinstance(data, dict):
            errors.append(f"{path.name}: not a probe report")
            continue
        reports.append(data)
    for path in sorted(out_dir.glob("probe-*.error")):
        errors.append(f"{path.name}: {path.read_text().strip()}")
    reports.sort(key=lambda r: (_num(r.get("started_at")), _num(r.get("pid"))))
    return reports, errors


def _num(x: Any, default: float = 0.0) -> float:
    try:
        v = float(x)
    except (TypeError, ValueError):
        return default
    return v if v == v else default


def _int(x: Any) -> int:
    return int(_num(x))


def _near(sorted_ts: list[float], t: float, tol: float) -> bool:
    i = bisect.bisect_left(sorted_ts, t)
    return any(abs(sorted_ts[k] - t) <= tol for k in (i - 1, i) if 0 <= k < len(sorted_ts))


def _steps(r: dict[str, Any]) -> tuple[int, list[list[float]]]:
    clock = r.get("clock") or {}
    return _int(clock.get("steps")), list(clock.get("step_times") or [])


def _windows(r: dict[str, Any]) -> list[tuple[float, float]]:
    return [(_num(w.get("t0")), _num(w.get("t1"), float("inf"))) for w in r.get("eval_windows") or []]


def _in_window(windows: list[tuple[float, float]], t: float) -> bool:
    return any(a <= t <= b for a, b in windows)


def _compile_events(r: dict[str, Any]) -> list[dict[str, Any]]:
    _, step_times = _steps(r)
    windows = _windows(r)
    pid = r.get("pid")
    events: list[dict[str, Any]] = []

    def add(source: str, kind: str, t: float, function: str | None, cause: str | None,
            step: int | None = None, in_eval: bool | None = None) -> None:
        if step is None and step_times:
            step = step_at(step_times, t)
        events.append({"source": source, "kind": kind, "t": t, "pid": pid, "function": function,
                       "cause": cause, "step": step,
                       "eval": bool(in_eval) if in_eval is not None else _in_window(windows, t)})

    xla = r.get("xla") or {}
    for sample in (xla.get("compile") or {}).get("samples", []):
        add("xla", "compile", _num(sample[0]), None, None)
    jax = r.get("jax") or {}
    hits = sorted(_num(h.get("t")) for h in jax.get("cache_hits", []))
    for c in jax.get("compiles", []):
        # a persistent-cache hit is reported as a backend compile too; it costs no compilation
        if _near(hits, _num(c.get("t")), 0.05):
            continue
        add("jax", "compile", _num(c.get("t")), c.get("function"), None, c.get("step"), c.get("eval"))
    dyn = r.get("dynamo") or {}
    for rc in dyn.get("recompiles", []):
        add("dynamo", "recompile", _num(rc.get("t")), rc.get("function"),
            rc.get("reason") or str(rc.get("message", ""))[:300], rc.get("step"), rc.get("eval"))
    for hit in dyn.get("recompile_limit", []):
        add("dynamo", "recompile_limit", _num(hit.get("t")), hit.get("function"), hit.get("reason"),
            hit.get("step"), hit.get("eval"))
    for gb in dyn.get("graph_breaks", []):
        add("dynamo", "graph_break", _num(gb.get("t")), None, gb.get("reason") or gb.get("where"),
            gb.get("step"), gb.get("eval"))
    return events


def _default_rules() -> "L2Rules":
    from ladder.migration.protocol import load_protocol

    return load_protocol().l2


def main_process(probe: dict[str, Any]) -> dict[str, Any] | None:
    """The training process: the one that stepped the most (rank 0 on ties: the first started)."""
    procs = probe.get("processes") or []
    if not procs:
        return None
    return max(procs, key=lambda r: (_steps(r)[0], -procs.index(r)))


def merge_reports(out_dir: Path, rules: "L2Rules | None" = None) -> dict[str, Any] | None:
    """Merge `probe-<pid>.json` files into one dict; None when there are none.

    `rules` classifies aten counters for display (the default protocol's when None); the L2 checks
    re-classify the raw counters with their own protocol, so this choice never decides a verdict.
    """
    out_dir = Path(out_dir)
    if not out_dir.is_dir():
        return None
    reports, read_errors = _read_reports(out_dir)
    if not reports:
        return None
    rules = rules or _default_rules()
    frameworks: dict[str, str] = {}
    torch_devices: dict[str, dict[str, int]] = {"param": {}, "input": {}}
    first_seen: dict[str, Any] = {}
    last_step: dict[str, int] = {}  # per device, the optimizer steps before its latest sampled forward (any process)
    aten: dict[str, int] = {}
    xla_types, jax_backends, jax_platforms = set(), set(), set()
    host = {"transfer_from_device": 0, "reads": 0, "host_sync_ops": 0}
    compiles = {"xla": 0, "xla_uncached": 0, "xla_cached": 0, "jax": 0, "jax_cache_hits": 0,
                "dynamo_recompiles": 0, "dynamo_graph_breaks": 0, "dynamo_unique_graphs": 0}
    xla_execute = 0
    events: list[dict[str, Any]] = []
    errors = list(read_errors)
    nonfinite: list[str] = []
    skipped = 0
    for r in reports:
        pid = r.get("pid")
        frameworks.update({str(k): str(v) for k, v in (r.get("frameworks") or {}).items()})
        t = r.get("torch") or {}
        for kind, key in (("param", "param_devices"), ("input", "input_devices")):
            for dev, n in (t.get(key) or {}).items():
                torch_devices[kind][dev] = torch_devices[kind].get(dev, 0) + _int(n)
        for dev, seen in (t.get("first_seen") or {}).items():
            if dev not in first_seen or _num(seen.get("t")) < _num(first_seen[dev].get("t")):
                first_seen[dev] = {**seen, "pid": pid}
        for dev, step in (t.get("last_step") or {}).items():
            last_step[dev] = max(last_step.get(dev, 0), _int(step))
        skipped += _int((t.get("grad_scaler") or {}).get("skipped"))
        x = r.get("xla") or {}
        if x:
            if x.get("device_type"):
                xla_types.add(str(x["device_type"]))
            for name, n in (x.get("aten") or {}).items():
                aten[name] = aten.get(name, 0) + _int(n)
            c = x.get("counters") or {}
            compiles["xla"] += _int((x.get("compile") or {}).get("count"))
            compiles["xla_uncached"] += _int(c.get("UncachedCompile"))
            compiles["xla_cached"] += _int(c.get("CachedCompile"))
            xla_execute += _int((x.get("execute") or {}).get("count")) + _int((x.get("execute_replicated") or {}).get("count"))
            host["transfer_from_device"] += _int((x.get("transfer_from_device") or {}).get("count"))
        j = r.get("jax") or {}
        if j:
            if j.get("backend"):
                jax_backends.add(str(j["backend"]))
            jax_platforms.update(str(p) for p in j.get("platforms") or [])
            compiles["jax_cache_hits"] += len(j.get("cache_hits") or [])
        host["reads"] += _int((r.get("host_reads") or {}).get("total"))
        d = r.get("dynamo") or {}
        compiles["dynamo_unique_graphs"] += _int(((d.get("counters") or {}).get("stats") or {}).get("unique_graphs"))
        ev = _compile_events(r)
        events += ev
        compiles["jax"] += sum(1 for e in ev if e["source"] == "jax")
        compiles["dynamo_recompiles"] += sum(1 for e in ev if e["kind"] == "recompile")
        compiles["dynamo_graph_breaks"] += sum(1 for e in ev if e["kind"] == "graph_break")
        errors += [f"pid {pid}: {e}" for e in r.get("errors") or []]
        nonfinite += [f"pid {pid}: {n}" for n in r.get("nonfinite_params") or []]
    main = max(reports, key=lambda r: (_steps(r)[0], -reports.index(r)))
    classified = classify_aten(aten, rules.fallback_allow, rules.host_sync_ops)
    host["host_sync_ops"] = sum(classified["host_sync"].values())
    events.sort(key=lambda e: e["t"])
    return {
        "schema": MERGED_SCHEMA,
        "frameworks": frameworks,
        "platforms": {"torch": sorted(set(torch_devices["param"]) | set(torch_devices["input"])),
                      "xla": sorted(xla_types), "jax": sorted(jax_backends),
                      "jax_devices": sorted(jax_platforms)},
        "torch_devices": {**torch_devices, "first_seen": first_seen, **({"last_step": last_step} if last_step else {})},
        "xla_executions": xla_execute,
        "optimizer_steps": _steps(main)[0],
        "main_pid": main.get("pid"),
        "compiles": compiles,
        "compile_events": events,
        "aten_counters": aten,
        "aten": classified,
        "host_transfers": host,
        "optimizers": main.get("optimizers") or [],
        "update_samples": main.get("update_samples"),
        "eval_windows": main.get("eval_windows") or [],
        "nonfinite_params": nonfinite,
        "skipped_steps": skipped,
        "grad_norms": (main.get("grad_norms") or None),
        "seed": main.get("seed"),
        "random": _random(reports),
        "batches": [{**r["batches"], "pid": r.get("pid"), "span": [r.get("started_at"), r.get("ended_at")]}
                    for r in reports if r.get("batches")],
        "errors": errors,
        "processes": reports,
    }


def _random(reports: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The JAX random draws made while training, over every process (None when none drew)."""
    facts = [((r.get("jax") or {}).get("random"), r.get("pid")) for r in reports]
    facts = [(f, pid) for f, pid in facts if f]
    if not facts:
        return None
    return {"step_draws": [{**d, "pid": pid} for f, pid in facts for d in f.get("step_draws") or []],
            "host_draws": [{**d, "pid": pid} for f, pid in facts for d in f.get("host_draws") or []]}


# ---------------------------------------------------------------- measures shared by run and baseline

@dataclass
class ReadRate:
    """Host reads per training step in one process, evaluation apart."""

    pid: Any
    per_step: float
    steps_judged: int
    train_reads: int
    eval_reads: int
    after_training: int
    ops: dict[str, int] = field(default_factory=dict)
    host_left_out: int = 0  # reads of values already in host memory, left out (device_only)

    def describe(self) -> str:
        ops = ", ".join(f"{k} x{v}" for k, v in sorted(self.ops.items(), key=lambda kv: -kv[1])[:4])
        host = (f"; {self.host_left_out} reads of tensors already in host memory left out, which move nothing from "
                f"the device" if self.host_left_out else "")
        return (f"{self.per_step:.3f} reads per training step over {self.steps_judged} steps "
                f"({self.train_reads} in training; {self.eval_reads} during evaluation and "
                f"{self.after_training} after the last step, not judged; {ops or 'no reads'}{host})")


def logged_steps_per_step(run: "RunRecord") -> float | None:
    """How many of the log's training steps one step of the probe's clock covers: the last logged step over
    the most steps any process counted. 1 where each optimizer call is one training step; 25 for a port that
    runs 25 steps in one jitted call (a `lax.scan` over stacked batches). None without a loss curve or steps."""
    steps = max((_steps(p)[0] for p in (run.probe or {}).get("processes") or []), default=0)
    last = max((pt.step for pt in run.loss_curve), default=0)
    return last / steps if steps > 0 and last > 0 else None


def eval_steps(run: "RunRecord", proc: dict[str, Any]) -> set[int]:
    """The steps after which an evaluation ran, for a process whose evaluations the probe could not see (no
    module switched to eval mode): from the log's eval lines (their step, else their time mapped through
    the process's step clock). Empty when the probe saw evaluation windows: those time the evaluation
    exactly, and a step's interval also holds the next step's forward pass, which is training."""
    steps_: set[int] = set()
    if proc.get("eval_windows"):
        return steps_
    _, step_times = _steps(proc)
    for e in run.evals:
        if e.step is not None:
            steps_.add(int(e.step))
        elif step_times:
            steps_.add(step_at(step_times, run.started_at + e.t))
    return steps_


def read_rates(run: "RunRecord", device_only: bool = False) -> list[ReadRate] | None:
    """Per process with training steps; None when the probe did not count host reads (an old report).
    `device_only`: leave out reads of values already in host memory (a CPU tensor's `.numpy()` in a port that
    computes on an accelerator moves nothing from the device); a CPU reference's reads all count, as what its
    device would read."""
    probe = run.probe or {}
    procs = [p for p in probe.get("processes") or [] if "host_reads" in p]
    if not procs:
        return None
    out = []
    for p in procs:
        steps, _ = _steps(p)
        if steps < 2:
            continue
        hr = p.get("host_reads") or {}
        evals = eval_steps(run, p)
        train = eval_r = after = judged = 0
        by = {_int(s): (_int(a), _int(b)) for s, a, b in hr.get("by_step") or []}
        left_out = 0
        if device_only:
            for s, a, b in hr.get("host_by_step") or []:
                x, y = by.get(_int(s), (0, 0))
                by[_int(s)] = (x - _int(a), y - _int(b))
                left_out += _int(a) + _int(b)
        for s in range(1, steps):  # the interval after step s; before step 1 is set-up, after the last is the end
            a, b = by.get(s, (0, 0))
            if s in evals:
                eval_r += a + b
                continue
            eval_r += b
            train += a
            judged += 1
        for s, (a, b) in by.items():
            if s >= steps:
                after += a + b
        out.append(ReadRate(p.get("pid"), train / judged if judged else 0.0, judged, train, eval_r, after,
                            {str(k): _int(v) for k, v in (hr.get("ops") or {}).items()}, left_out))
    return out


@dataclass
class CompileGrowth:
    """New compiled graphs in one process: when in training they happened (first half, second half), and
    which ones were evaluation's or the last step's (allowed)."""

    pid: Any
    steps: int
    first_half: int
    second_half_steps: list[int]
    allowed: int  # evaluation's and the last step's compiles
    events: list[dict[str, Any]] = field(default_factory=list)
    # evaluations after the first at which a function the evaluation compiled before compiled again: one graph
    # for evaluation is allowed, not a new one at every evaluation (a jit built inside the evaluation function)
    eval_repeat_steps: list[int] = field(default_factory=list)
    eval_repeat_events: list[dict[str, Any]] = field(default_factory=list)
    # the steps of every training compile (warm-up included), and the steps the learning rate changed at
    train_steps: list[int] = field(default_factory=list)
    rate_changes: list[int] = field(default_factory=list)

    def after_rate_change(self, quiet: int) -> list[int]:
        """Second-half compile steps explained by a change of the learning rate that the graphs are not keyed
        on. A rate baked into a graph (a static argument, a constant) builds new graphs at every change, and
        at every step under a per-step schedule: that stays growth. But when some change built no graph, the
        graphs do not depend on the rate's value, and new ones right after another change are a one-off that
        the new value happened to cause (torch_xla's sync-free SGD shares one device scalar between equal
        values: once the rate equals the weight decay, its graph has one input fewer). Counted as such only
        when compiling had stopped (at most `quiet` first-half compiles after warm-up), within as many steps
        after the change as the program took to build its graphs at the start, and no more of them."""
        if not self.rate_changes or self.first_half > quiet:
            return []
        # a change's graphs are built in the step it applies to, or in the interval before (a compile in the
        # forward pass falls after the previous optimizer step)
        changes = self.rate_changes
        initial = [s for s in self.train_steps if s < min(changes[0] - 1, self.steps / 2 + 1)]
        if not initial:
            return []
        span, most = max(max(initial) - 1, 0), len(initial)  # the last initial graph's distance from step 1
        windows = []
        for i, c in enumerate(changes):
            end = c + span if i + 1 == len(changes) else min(c + span, changes[i + 1] - 2)
            windows.append([s for s in self.train_steps if c - 1 <= s <= end])
        if all(windows):  # every change built graphs: the rate is in them
            return []
        late = set(self.second_half_steps)
        return sorted({s for w in windows for s in w[:most] if s in late})


def _rate_changes(r: dict[str, Any]) -> list[int]:
    """Steps at which any optimizer's recorded learning rate changed (its change log after the first value; an
    optimizer built again continues its earlier object's log)."""
    steps = {_int(v[0]) for o in timelines(r.get("optimizers") or [])[0]
             for v in ((o.get("lr") or {}).get("values") or [])[1:] if isinstance(v, (list, tuple)) and v}
    return sorted(s for s in steps if s > 1)


def compile_growth(run: "RunRecord", warmup: int) -> list[CompileGrowth]:
    probe = run.probe or {}
    out = []
    for p in probe.get("processes") or []:
        steps, _ = _steps(p)
        evals = eval_steps(run, p)
        late_steps: set[int] = set()
        first = allowed = 0
        late_events = []
        train_steps: set[int] = set()
        eval_first: dict[str, int] = {}
        repeats: set[int] = set()
        repeat_events = []
        for e in _compile_events(p):
            if e["kind"] == "graph_break":
                continue
            s = e.get("step")
            if s is None:
                continue
            if e.get("eval") or s in evals or s >= steps:
                allowed += 1
                if e.get("eval") or s in evals:
                    fn = str(e.get("function") or e.get("source"))
                    if eval_first.setdefault(fn, int(s)) != int(s):
                        repeats.add(int(s))
                        repeat_events.append(e)
                continue
            train_steps.add(int(s))
            if s <= warmup:
                continue
            if s <= steps / 2:
                first += 1
            else:
                late_steps.add(int(s))
                late_events.append(e)
        out.append(CompileGrowth(p.get("pid"), steps, first, sorted(late_steps), allowed, late_events,
                                 sorted(repeats), repeat_events, sorted(train_steps), _rate_changes(p)))
    return out
