"""L1 `parity`: the port computes the reference's tensors on the same weights and batches (ladder.parity).

Present when the spec has a [parity] table (not_applicable otherwise). The caller names the two side runs
in ctx.options["parity"] ({reference, target, tolerance}); None there means they did not run: not_checked.
The verdict names the first tensor beyond tolerance, in the stable order outputs, loss, gradients (in
the reference's parameter order), parameters after K steps, with its magnitude.
"""

from __future__ import annotations

from pathlib import Path

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.results import CheckResult
from ladder.parity.compare import compare_sides

NAME = "parity"


def _fmt(x: float) -> str:
    return f"{x:.3g}"


def _decay_moved(ctx: CheckContext, report) -> str | None:  # noqa: ANN001 - a ParityReport
    """The L2 rule's account (ladder.checks.l2.decay_moved) of gradients that differ by c x the weights, on the
    optimizers the probe saw in this run and its baseline run: parity alone cannot tell an L2 term the other
    side's optimizer applies as decay from an added one."""
    from ladder.checks.l2 import decay_moved

    ref = ctx.reference()
    mine = (ctx.run.probe or {}).get("optimizers") or []
    theirs = ((ref.probe if ref is not None else None) or {}).get("optimizers") or []
    if not mine or not theirs:
        return None
    return decay_moved(mine[0], theirs[0], report, ctx.protocol.l2.optimizer_ignore)


@register("L1", NAME)
def parity(ctx: CheckContext) -> CheckResult:
    if "parity" not in ctx.options:
        return CheckResult(level="L1", name=NAME, status="not_applicable",
                           evidence="the spec has no [parity] table: no tensor-level comparison asked for")
    sides = ctx.options["parity"]
    if not sides:
        why = ctx.options.get("parity_why") or "no parity run was given"
        return not_checked("L1", NAME, f"{why}: run `ladder parity --source DIR`, then `ladder check RUN "
                                       "--parity DIR`")
    tolerance = sides["tolerance"]
    tol = ctx.protocol.parity.tolerances.get(tolerance)
    if tol is None:
        return not_checked("L1", NAME, f"the protocol has no [parity.tolerances.{tolerance}]")
    report = compare_sides(Path(sides["reference"]), Path(sides["target"]), tol, tolerance)
    threshold = {"tolerance": tolerance, **tol.model_dump()}
    details = report.as_dict()
    if report.problems:
        return CheckResult(level="L1", name=NAME, status="failed", measured={"interface_problems": len(report.problems)},
                           threshold=threshold, evidence="interface: " + "; ".join(report.problems), details=details)
    first = report.first_failure
    moved = _decay_moved(ctx, report) if first is not None else None
    if moved:
        return CheckResult(level="L1", name=NAME, status="passed", threshold=threshold, details=details,
                           measured={"tensors": len(report.rows), "decay_terms": report.decay_terms},
                           evidence=f"{sum(not r.passed for r in report.rows)} of {len(report.rows)} tensors beyond "
                                    f"{tolerance}, all by a moved weight decay: {moved}")
    if first is not None:
        return CheckResult(
            level="L1", name=NAME, status="failed", threshold=threshold, details=details,
            measured={"tensor": first.tensor, "max_abs_diff": first.max_abs_diff, "rel_diff": first.rel_diff,
                      "cosine": first.cosine},
            evidence=f"first tensor that differs: {first.tensor} (max |diff| {_fmt(first.max_abs_diff)}, rel "
                     f"{_fmt(first.rel_diff)}, cos {first.cosine:.6f}; {first.rule}); "
                     f"{sum(not r.passed for r in report.rows)} of {len(report.rows)} tensors beyond {tolerance}")
    worst = max(report.rows, key=lambda r: r.rel_diff)
    return CheckResult(level="L1", name=NAME, status="passed", threshold=threshold, details=details,
                       measured={"tensors": len(report.rows), "worst": worst.tensor, "worst_rel_diff": worst.rel_diff},
                       evidence=f"all {len(report.rows)} tensors within {tolerance} (outputs, loss, gradients, "
                                f"parameters after K steps); largest relative difference {_fmt(worst.rel_diff)} "
                                f"({worst.tensor})")
