"""L3 `weights_load_back`: the port's trained weights load into the reference model under the reference's
names, strictly, and the reference's own evaluation of them gives the metric the port reported.

Present when the spec's [parity] names `export` and `evaluate` (not_applicable otherwise). The caller runs
the evaluation (ladder.parity.runs.run_load_back) and names its run directory in
ctx.options["load_back"] ({dir} or {dir: None, why}).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.compare import rel_diff
from ladder.checks.l3 import full_run_of
from ladder.checks.results import CheckResult

NAME = "weights_load_back"


def _strict_problems(strict: dict) -> list[str]:
    out = []
    for key in ("missing", "unexpected"):
        if strict.get(key):
            out.append(f"{key}: {', '.join(strict[key][:10])}" + (" ..." if len(strict[key]) > 10 else ""))
    shaped = strict.get("mis_shaped") or {}
    if shaped:
        out.append("mis-shaped: " + ", ".join(f"{k} {v['found']} (expected {v['expected']})"
                                               for k, v in list(shaped.items())[:10]))
    return out


@register("L3", NAME)
def weights_load_back(ctx: CheckContext) -> CheckResult:
    if "load_back" not in ctx.options:
        return CheckResult(level="L3", name=NAME, status="not_applicable",
                           evidence="the spec's [parity] names no export and evaluate: no weights to load back")
    run = full_run_of(ctx)
    if run is None:
        return not_checked("L3", NAME, "no full run of this attempt: its exported weights are what loads back")
    opt = ctx.options["load_back"]
    if opt is None:
        return not_checked("L3", NAME, "the reference did not evaluate the port's weights: run `ladder load-back "
                                       "FULL_RUN_DIR`, then `ladder check --load-back DIR`")
    if not opt.get("dir"):
        return CheckResult(level="L3", name=NAME, status="failed",
                           evidence=opt.get("why") or "the full run exported no weights to load back")
    path = Path(opt["dir"]) / "evaluate.json"
    if not path.is_file():
        return CheckResult(level="L3", name=NAME, status="failed",
                           evidence=f"the reference's evaluation wrote no {path.name}: see {path.parent}/stderr.log")
    result = json.loads(path.read_text())
    problems = _strict_problems(result.get("strict") or {})
    unread = [k for k, n in (result.get("reads") or {}).items() if n == 0]
    if not result.get("strict") and unread:
        problems.append(f"unexpected (never read by the reference model): {', '.join(unread[:10])}")
    details = {"evaluate": result, "dir": str(opt["dir"])}
    if problems:
        return CheckResult(level="L3", name=NAME, status="failed", measured={"problems": len(problems)},
                           evidence="the exported weights do not load strictly into the reference model: "
                                    + "; ".join(problems), details=details)
    metric = result.get("metric")
    if result.get("error") or metric is None or not math.isfinite(float(metric)):
        return CheckResult(level="L3", name=NAME, status="failed", details=details,
                           evidence=f"the reference's evaluation failed: {result.get('error') or 'no metric'}")
    if run.metric is None:
        return CheckResult(level="L3", name=NAME, status="failed", details=details,
                           evidence=f"the port's full run reported no {run.metric_name or 'metric'} to compare with")
    tol = ctx.protocol.parity.load_back_metric_rel_tol
    d = rel_diff(float(metric), run.metric)
    ok = d <= tol
    return CheckResult(level="L3", name=NAME, status="passed" if ok else "failed", measured=round(d, 6),
                       threshold=tol, details=details,
                       evidence=f"the reference model, loaded strictly with the port's weights, evaluates to "
                                f"{run.metric_name} {float(metric):.6g}; the port reported {run.metric:.6g} "
                                f"(relative difference {d:.3g}, tolerance {tol:g})")
