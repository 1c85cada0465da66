"""The ladder side of the injected probe: the environment that injects it, and the merge of its
per-process reports into one dict (stored as `RunRecord.probe`).

Owns: where the probe lives, how its reports are read and summarised for the L2 checks.
Must not: judge a run (that is ladder.checks.l2), or import any framework. The per-process reports
are kept whole under `processes`; the summaries are derived from them and can be recomputed.
"""

from __future__ import annotations

import bisect
import json
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ladder.migration.protocol import L2Rules

PROBE_DIR = Path(__file__).resolve().parent.parent / "probe"
MERGED_SCHEMA = 1


def probe_env(out_dir: Path, options: dict[str, Any] | None = None) -> dict[str, str]:
    """Env vars to add to a captured run: the probe first on PYTHONPATH, where reports go, options."""
    existing = os.environ.get("PYTHONPATH", "")
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
            reports.append(json.loads(path.read_text()))
        except (OSError, ValueError) as e:
            errors.append(f"{path.name}: unreadable report ({e})")
    for path in sorted(out_dir.glob("probe-*.error")):
        errors.append(f"{path.name}: {path.read_text().strip()}")
    reports.sort(key=lambda r: (r.get("started_at") or 0.0, r.get("pid") or 0))
    return reports, errors


def _near(sorted_ts: list[float], t: float, tol: float) -> bool:
    i = bisect.bisect_left(sorted_ts, t)
    return any(abs(sorted_ts[k] - t) <= tol for k in (i - 1, i) if 0 <= k < len(sorted_ts))


def _compile_events(r: dict[str, Any]) -> list[dict[str, Any]]:
    steps = (r.get("optimizer") or {}).get("step_times") or []
    pid = r.get("pid")
    events: list[dict[str, Any]] = []

    def add(source: str, kind: str, t: float, function: str | None, cause: str | None) -> None:
        events.append({"source": source, "kind": kind, "t": t, "pid": pid, "function": function,
                       "cause": cause, "step": step_at(steps, t) if steps else None})

    xla = r.get("xla") or {}
    for t, _ns in (xla.get("compile") or {}).get("samples", []):
        add("xla", "compile", t, None, None)
    jax = r.get("jax") or {}
    hits = sorted(h["t"] for h in jax.get("cache_hits", []))
    for c in jax.get("compiles", []):
        # a persistent-cache hit is reported as a backend compile too; it costs no compilation
        if _near(hits, c["t"], 0.05):
            continue
        add("jax", "compile", c["t"], c.get("function"), None)
    dyn = r.get("dynamo") or {}
    for rc in dyn.get("recompiles", []):
        add("dynamo", "recompile", rc["t"], rc.get("function"), rc.get("reason") or rc.get("message", "")[:300])
    for hit in dyn.get("recompile_limit", []):
        add("dynamo", "recompile_limit", hit["t"], hit.get("function"), hit.get("reason"))
    for gb in dyn.get("graph_breaks", []):
        add("dynamo", "graph_break", gb["t"], None, gb.get("reason") or gb.get("where"))
    return events


def _default_rules() -> "L2Rules":
    from ladder.migration.protocol import load_protocol

    return load_protocol().l2


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
    aten: dict[str, int] = {}
    xla_types, jax_backends, jax_platforms = set(), set(), set()
    host = {"transfer_from_device": 0, "jax_host_reads": 0, "host_sync_ops": 0}
    compiles = {"xla": 0, "xla_uncached": 0, "xla_cached": 0, "jax": 0, "jax_cache_hits": 0,
                "dynamo_recompiles": 0, "dynamo_graph_breaks": 0, "dynamo_unique_graphs": 0}
    xla_execute = 0
    events: list[dict[str, Any]] = []
    optimizers: list[dict[str, Any]] = []
    errors = list(read_errors)
    nonfinite: list[str] = []
    steps = 0
    grad_norms: dict[str, Any] = {}
    for r in reports:
        pid = r.get("pid")
        frameworks.update(r.get("frameworks") or {})
        t = r.get("torch") or {}
        for kind, key in (("param", "param_devices"), ("input", "input_devices")):
            for dev, n in (t.get(key) or {}).items():
                torch_devices[kind][dev] = torch_devices[kind].get(dev, 0) + n
        for dev, seen in (t.get("first_seen") or {}).items():
            if dev not in first_seen or seen["t"] < first_seen[dev]["t"]:
                first_seen[dev] = {**seen, "pid": pid}
        x = r.get("xla") or {}
        if x:
            if x.get("device_type"):
                xla_types.add(str(x["device_type"]))
            for name, n in (x.get("aten") or {}).items():
                aten[name] = aten.get(name, 0) + n
            c = x.get("counters") or {}
            compiles["xla"] += (x.get("compile") or {}).get("count", 0)
            compiles["xla_uncached"] += c.get("UncachedCompile", 0)
            compiles["xla_cached"] += c.get("CachedCompile", 0)
            xla_execute += (x.get("execute") or {}).get("count", 0) + (x.get("execute_replicated") or {}).get("count", 0)
            host["transfer_from_device"] += (x.get("transfer_from_device") or {}).get("count", 0)
        j = r.get("jax") or {}
        if j:
            if j.get("backend"):
                jax_backends.add(j["backend"])
            jax_platforms.update(j.get("platforms") or [])
            compiles["jax_cache_hits"] += len(j.get("cache_hits") or [])
            host["jax_host_reads"] += j.get("host_reads") or 0
        d = r.get("dynamo") or {}
        compiles["dynamo_unique_graphs"] += ((d.get("counters") or {}).get("stats") or {}).get("unique_graphs", 0)
        ev = _compile_events(r)
        events += ev
        compiles["jax"] += sum(1 for e in ev if e["source"] == "jax")
        compiles["dynamo_recompiles"] += sum(1 for e in ev if e["kind"] == "recompile")
        compiles["dynamo_graph_breaks"] += sum(1 for e in ev if e["kind"] == "graph_break")
        for o in r.get("optimizers") or []:
            optimizers.append({**o, "pid": pid})
        errors += [f"pid {pid}: {e}" for e in r.get("errors") or []]
        nonfinite += [f"pid {pid}: {n}" for n in r.get("nonfinite_params") or []]
        steps = max(steps, (r.get("optimizer") or {}).get("steps", 0))
        gn = r.get("grad_norms") or {}
        if len(gn.get("values") or []) > len(grad_norms.get("values") or []):
            grad_norms = {**gn, "pid": pid}  # the training process: the one that stepped the most
    classified = classify_aten(aten, rules.fallback_allow, rules.host_sync_ops)
    host["host_sync_ops"] = sum(classified["host_sync"].values())
    events.sort(key=lambda e: e["t"])
    return {
        "schema": MERGED_SCHEMA,
        "frameworks": frameworks,
        "platforms": {"torch": sorted(set(torch_devices["param"]) | set(torch_devices["input"])),
                      "xla": sorted(xla_types), "jax": sorted(jax_backends),
                      "jax_devices": sorted(jax_platforms)},
        "torch_devices": {**torch_devices, "first_seen": first_seen},
        "xla_executions": xla_execute,
        "optimizer_steps": steps,
        "compiles": compiles,
        "compile_events": events,
        "aten_counters": aten,
        "aten": classified,
        "host_transfers": host,
        "optimizers": optimizers,
        "nonfinite_params": nonfinite,
        "grad_norms": grad_norms or None,
        "errors": errors,
        "processes": reports,
    }
