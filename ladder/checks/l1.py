"""L1: loss and metric near the baseline, and the loss trends agree.

The protocol chooses the rule ([l1].rule). "calibrated" (the default) judges the run against the
spread of the baseline's own seeds (ladder.checks.stats): the same kind's seeds, or for a full run
with fewer than min_seeds full seeds the short seeds' relative spread, said so in the evidence; with
too few seeds the verdict is undecided and names the seeds that would decide. "fixed" is the study's
rule against one baseline run (5% loss window, 1% metric, trends agree). The other rule's numbers are
always reported beside the deciding one.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.compare import pairing, rel_diff, trend_test, window_mean
from ladder.checks.results import CheckResult
from ladder.checks.stats import Seeds, Verdict
from ladder.runs.records import RunRecord


def seeds_for(ctx: CheckContext) -> Seeds:
    """The baseline runs to judge this run against: its kind's seeds, and the other kind's to borrow from."""
    if ctx.baseline is None:
        return Seeds([])
    b = ctx.baseline
    if ctx.run.kind == "full":
        return Seeds(list(b.full_runs), list(b.short_runs), "short")
    return Seeds(list(b.short_runs), [], "full")


def calibrated_rule(ctx: CheckContext) -> bool:
    return ctx.protocol.l1.rule == "calibrated"


def extend_hint(kind: str, seeds: int, more: int) -> str:
    """The command that adds the seeds an undecided verdict asks for (the flags take totals)."""
    return f"ladder baseline extend {'--seeds' if kind == 'short' else '--full-seeds'} {seeds + more}"


def _calibrated(name: str, ctx: CheckContext, v: "Verdict", measured: Any, fixed_text: str,
                details: dict[str, Any]) -> CheckResult:
    details["calibrated"] = v.as_dict()
    text = v.explain() + (f" ({extend_hint(ctx.run.kind, v.seeds, v.more_seeds)})" if v.status == "undecided" else "")
    return CheckResult(level="L1", name=name, status=v.status, measured=measured,  # type: ignore[arg-type]
                       threshold=v.band, evidence=f"{text} | {fixed_text}", details=details)


@register("L1", "loss_window")
def loss_window(ctx: CheckContext) -> CheckResult:
    ref = ctx.reference()
    if ref is None:
        return not_checked("L1", "loss_window", "no baseline run of this kind to compare with")
    frac = ctx.protocol.l1.window_fraction
    mine, theirs = window_mean(ctx.run.loss_curve, frac), window_mean(ref.loss_curve, frac)
    if mine is None or theirs is None:
        return CheckResult(level="L1", name="loss_window", status="failed",
                           evidence="no finite loss points in the run or the baseline")
    d = rel_diff(mine, theirs)
    tol = ctx.protocol.l1.loss_rel_tol
    fixed_ok = d <= tol
    details = {"fixed_rule": {"run": mine, "baseline": theirs, "rel_diff": d, "tol": tol, "passed": fixed_ok}}
    ev = (f"mean loss over the last {frac:.0%} of steps: run {mine:.5f} vs baseline {theirs:.5f} "
          f"(seed {ref.seed}), relative difference {d:.2%} (fixed rule: within {tol:.0%})")
    if calibrated_rule(ctx):
        from ladder.checks.stats import calibrated_loss_window

        return _logged_after_update(ctx, _calibrated(
            "loss_window", ctx, calibrated_loss_window(ctx.run, seeds_for(ctx), ctx.protocol), mine, ev, details))
    return CheckResult(level="L1", name="loss_window", status="passed" if fixed_ok else "failed",
                       measured=round(d, 6), threshold=tol, evidence=ev + " | the protocol's rule is the fixed rule",
                       details=details)


@register("L1", "metric")
def metric(ctx: CheckContext) -> CheckResult:
    ref = ctx.reference()
    if ref is None or ref.metric is None:
        return not_checked("L1", "metric", "no baseline metric to compare with")
    if ctx.run.metric is None:
        return CheckResult(level="L1", name="metric", status="failed", evidence="the run reported no metric")
    d = rel_diff(ctx.run.metric, ref.metric)
    tol = ctx.protocol.l1.metric_rel_tol
    fixed_ok = d <= tol
    details = {"fixed_rule": {"run": ctx.run.metric, "baseline": ref.metric, "rel_diff": d, "tol": tol,
                              "passed": fixed_ok}}
    ev = (f"{ctx.run.metric_name}: run {ctx.run.metric:.5g} vs baseline {ref.metric:.5g} (seed {ref.seed}), "
          f"relative difference {d:.2%} (fixed rule: within {tol:.0%})")
    if calibrated_rule(ctx):
        from ladder.checks.stats import calibrated_metric

        res = _calibrated("metric", ctx, calibrated_metric(ctx.run, seeds_for(ctx), ctx.protocol), ctx.run.metric,
                          ev, details)
        return _eval_inputs(ctx, _reported_evaluation(ctx, _same_seed_metric(ctx, res)))
    return CheckResult(level="L1", name="metric", status="passed" if fixed_ok else "failed", measured=round(d, 6),
                       threshold=tol, evidence=ev + " | the protocol's rule is the fixed rule", details=details)


def same_seed_run(ctx: CheckContext) -> RunRecord | None:
    """The baseline's run of this kind at this run's seed (a benchmark that keeps that seed out of the
    baseline hands it in as options["same_seed"][kind])."""
    ref = ctx.reference()
    if ref is not None and ref.seed == ctx.run.seed:
        return ref
    other = (ctx.options.get("same_seed") or {}).get(ctx.run.kind)
    return other if other is not None and other.seed == ctx.run.seed else None


def _same_seed_metric(ctx: CheckContext, res: CheckResult) -> CheckResult:
    """A run that reproduces the baseline's own run at its seed (a port that draws the same initial weights
    and batches: torch_xla from the host's generator) trained the same model to within its curves' drift;
    the seeds' spread is then far too wide a yardstick for its metric, which must agree with that run's to
    about the same drift. A metric off by more, after the same training, is an evaluation that differs
    (what it averages, over which items, in which mode)."""
    other = same_seed_run(ctx)
    r = ctx.protocol.l1
    if other is None or other.metric is None or ctx.run.metric is None or res.status == "failed":
        return res
    p = pairing(ctx.run.loss_curve, other.loss_curve)
    if p is None or p.first > r.same_seed_start_tol or p.drift > r.same_seed_max_drift:
        return res
    items = next((e.items for e in reversed(ctx.run.evals) if e.items), None)
    item = 1.0 / items / abs(other.metric) if items and other.metric else 0.0
    tol = max(r.same_seed_factor * p.drift, r.same_seed_floor, item)
    d = rel_diff(ctx.run.metric, other.metric)
    facts = {"seed": other.seed, "common_steps": p.steps, "first": p.first, "drift": p.drift, "drift_at": p.at,
             "metric_rel_diff": d, "tol": tol}
    details = {**(res.details or {}), "same_seed": facts}
    text = (f"the run reproduces the baseline's run at seed {other.seed}: its loss within {p.drift:.1e} at "
            f"{p.steps} common logged steps (largest at step {p.at}), and {ctx.run.metric_name} {ctx.run.metric:.6g} "
            f"vs {other.metric:.6g}, relative difference {d:.1e}")
    if d <= tol:
        return res.model_copy(update={"details": details, "evidence": f"{res.evidence} | {text} (within {tol:.1e})"})
    return res.model_copy(update={
        "status": "failed", "details": details,
        "evidence": f"{text}, beyond {tol:.1e} (max({r.same_seed_factor:g} x the loss drift, "
                    f"{r.same_seed_floor:g}, one evaluated item's share)): the same training, another result — "
                    f"the evaluation differs (what it averages, over which items, in which mode) | {res.evidence}"})


def _matches(value: float, metric: float) -> bool:
    """The same number as printed twice (the eval line and the metric line may round differently)."""
    return math.isfinite(value) and abs(value - metric) <= max(1e-6, 5e-4 * abs(metric))


def metric_source(run: RunRecord) -> dict[str, Any] | None:
    """Which of the run's logged evaluations its headline metric repeats: {"last": bool, "best": bool, "step": the
    evaluation's step or None, "best_step": the best evaluation's step}. "best" is by the metric's direction, among
    the evaluations' values that the metric matches somewhere. None without a metric or at least two evaluations."""
    if run.metric is None or not math.isfinite(run.metric) or len(run.evals) < 2:
        return None
    m = run.metric
    k = next((k for k in run.evals[-1].values if any(_matches(e.values.get(k, math.nan), m) for e in run.evals)),
             None)
    if k is None:
        return {"last": False, "best": False, "step": None, "best_step": None, "last_step": run.evals[-1].step}
    vals = [(e.step, e.values.get(k, math.nan)) for e in run.evals]
    finite = [(s, v) for s, v in vals if math.isfinite(v)]
    pick = max if run.metric_direction == "max" else min
    best_step, best = pick(finite, key=lambda sv: sv[1]) if finite else (None, math.nan)
    last = _matches(vals[-1][1], m)
    at = vals[-1][0] if last else next((s for s, v in reversed(vals) if _matches(v, m)), None)
    return {"last": last, "best": _matches(best, m), "step": at, "best_step": best_step, "last_step": vals[-1][0]}


def _reported_evaluation(ctx: CheckContext, res: CheckResult) -> CheckResult:
    """The headline metric is the last evaluation in every baseline run of this kind (or the best, in every one),
    and at least one of them tells the two apart; a run whose metric is the other one reports another quantity
    (the best checkpoint's score for the final one, or the other way round), however close the numbers."""
    theirs = [s for s in (metric_source(r) for r in seeds_for(ctx).same) if s is not None]
    mine = metric_source(ctx.run)
    if not theirs or mine is None or mine["last"] == mine["best"]:
        return res
    told = [s for s in theirs if s["last"] != s["best"]]  # seeds whose last evaluation was not their best
    if not told:
        return res
    if all(s["last"] for s in theirs) and mine["best"]:
        ours, other = "its best evaluation", "its last"
    elif all(s["best"] for s in theirs) and mine["last"]:
        ours, other = "its last evaluation", "its best"
    else:
        return res
    other_step = mine["last_step"] if mine["best"] else mine["best_step"]
    text = (f"the run's {ctx.run.metric_name} {ctx.run.metric:.6g} is {ours} (step {mine['step']}), not {other} "
            f"(step {other_step})")
    return res.model_copy(update={  # a metric already out of the band keeps its failure, with this reason first
        "status": "failed", "details": {**(res.details or {}), "reported": {"run": mine, "baseline": theirs}},
        "evidence": f"{text}; every baseline run of this kind reports {other.removeprefix('its ')} evaluation "
                    f"({len(told)} of {len(theirs)} with a last evaluation that was not the best): the port reports "
                    f"another quantity | {res.evidence}"})


def after_update(run: RunRecord, min_steps: int) -> dict[str, Any] | None:
    """How often the run evaluates a training batch again with the weights its step just updated, from the probe:
    {"share", "judged", "evaluated", "in_step"}. A call that is not a training step given the last step's batch
    before the next step (per process: the largest share), or a training step that computes with the parameters
    optax.apply_updates returned in it (every call: share 1). None when neither was measured on `min_steps` steps."""
    best: dict[str, Any] | None = None
    for b in (run.probe or {}).get("batches") or []:
        a = b.get("after_update") or {}
        judged, evaluated = int(a.get("judged") or 0), int(a.get("evaluated") or 0)
        in_step = {name: f for name, f in (a.get("in_step") or {}).items() if f.get("calls", 0) >= min_steps}
        if in_step:
            return {"share": 1.0, "judged": max(f["calls"] for f in in_step.values()), "evaluated": None,
                    "in_step": in_step}
        if judged >= min_steps and (best is None or evaluated / judged > best["share"]):
            best = {"share": evaluated / judged, "judged": judged, "evaluated": evaluated, "in_step": None}
    return best


def _logged_after_update(ctx: CheckContext, res: CheckResult) -> CheckResult:
    """A run that evaluates most training batches again right after their update, where no baseline run of its kind
    does, logs the loss of the updated weights (Flax's compute_metrics after the step): not the loss the gradient was
    taken at, lower while the rate is large, however close the window."""
    r = ctx.protocol.l1
    mine = after_update(ctx.run, r.after_update_min_steps)
    if mine is None or mine["share"] < r.after_update_share:
        return res
    runs = seeds_for(ctx).same
    theirs = [after_update(x, r.after_update_min_steps) for x in runs]
    if not runs or any(t is not None and t["share"] >= r.after_update_share for t in theirs):
        return res
    if mine["in_step"]:
        matmuls = max(f["matmuls"] for f in mine["in_step"].values())
        how = (f"its training step ({', '.join(sorted(mine['in_step']))}) computes {matmuls} matmul(s) with the "
               "parameters optax.apply_updates just returned, after its last update: the step's output is computed "
               "from the updated weights")
    else:
        how = (f"in {mine['evaluated']} of {mine['judged']} steps ({mine['share']:.0%}) a call after the step is given "
               "that step's batch again, with the weights the step just updated")
    measured = [t["share"] for t in theirs if t is not None]
    ref = (f"the reference's runs: at most {max(measured):.0%} of steps" if measured
           else "the reference's runs measured no such call")
    text = (f"the loss is likely logged after the update: {how} ({ref}, threshold {r.after_update_share:.0%}); the "
            "logged curve is then the updated weights' loss on each batch, not the loss the gradient was taken at")
    return res.model_copy(update={
        "status": "failed", "details": {**(res.details or {}), "after_update": {"run": mine, "baseline": theirs}},
        "evidence": f"{text} | {res.evidence}"})


_POINTS = 65  # quantiles compared of each sorted per-feature vector


def input_moments(run: RunRecord) -> dict[str, dict[str, Any]]:
    """The run's input moments per role and width ("train:256", "eval:256"), pooled over its processes from the
    probe's per-process count, mean and standard deviation of every feature. An evaluation place counts when its
    function was called after at most half of its process's training steps (at least 4): an evaluation, not a
    function called at every step (an augmentation outside the step)."""
    pooled: dict[str, list] = {}
    for b in (run.probe or {}).get("batches") or []:
        for key, m in (b.get("moments") or {}).items():
            role, width = key.split(":")[:2]
            if role == "eval" and int(m.get("steps") or 0) > max(4, int(m.get("of") or 0) // 2):
                continue
            n, mean, sd = int(m.get("rows") or 0), np.asarray(m.get("mean") or []), np.asarray(m.get("sd") or [])
            if n < 2 or mean.shape != sd.shape or not mean.size:
                continue
            key = f"{role}:{width}"
            p = pooled.get(key)
            if p is None:
                pooled[key] = [n, mean * n, (sd * sd + mean * mean) * n]
            elif p[1].shape == mean.shape:
                p[0] += n
                p[1] = p[1] + mean * n
                p[2] = p[2] + (sd * sd + mean * mean) * n
    out = {}
    for key, (n, s1, s2) in pooled.items():
        mean = s1 / n
        out[key] = {"rows": n, "mean": mean, "sd": np.sqrt(np.clip(s2 / n - mean * mean, 0, None))}
    return out


def eval_relation(run: RunRecord) -> dict[int, dict[str, Any]]:
    """How the run's evaluation inputs relate to its training inputs, per width seen in both roles: for every
    feature that varies in training, its evaluation mean less its training mean in training standard deviations
    (z) and the ratio of its evaluation and training deviations (r), each sorted and read at _POINTS quantiles.
    The same for any map applied to both roles feature by feature (a scale, a shift, channels last): it moves when
    the two roles are prepared differently (the test split standardised with its own statistics)."""
    m = input_moments(run)
    out: dict[int, dict[str, Any]] = {}
    for key, train in m.items():
        role, _, width = key.partition(":")
        ev = m.get(f"eval:{width}")
        if role != "train" or ev is None:
            continue
        sd = train["sd"]
        keep = sd > 1e-6 * max(float(sd.max()), 1e-30)
        if keep.sum() < 2:
            continue
        z = (ev["mean"][keep] - train["mean"][keep]) / sd[keep]
        r = ev["sd"][keep] / sd[keep]
        q = np.linspace(0, 1, _POINTS)
        out[int(width)] = {"z": np.quantile(z, q), "r": np.quantile(r, q), "features": int(keep.sum()),
                           "rows": [train["rows"], ev["rows"]]}
    return out


def _relation_distance(a: dict[str, Any], b: dict[str, Any]) -> float:
    return float(np.sqrt(np.mean((a["z"] - b["z"]) ** 2 + (a["r"] - b["r"]) ** 2)))


def _eval_inputs(ctx: CheckContext, res: CheckResult) -> CheckResult:
    """A run whose evaluation inputs relate to its training inputs otherwise than every reference seed's do is
    evaluated on inputs prepared another way (the test split standardised with its own statistics, or not at all):
    its metric measures the model on shifted inputs, by an amount seed noise may hide. Judged per width seen in
    both roles by the run and by at least two reference seeds, where the run's training inputs were summed over at
    least half as many rows as every seed's (an input the probe saw only now and then, through a loader that copies
    ahead, is a sample): the run's distance to the nearest seed, against the larger of eval_inputs_floor and
    eval_inputs_factor times the largest distance between two seeds."""
    r = ctx.protocol.l1
    mine = eval_relation(ctx.run)
    if not mine:
        return res
    theirs = [eval_relation(x) for x in seeds_for(ctx).same]
    for width, rel in sorted(mine.items()):
        refs = [t[width] for t in theirs if width in t]
        if len(refs) < 2 or rel["rows"][0] < 0.5 * min(x["rows"][0] for x in refs):
            continue  # too few seeds, or the run's training inputs summed over a part of its steps only
        d = min(_relation_distance(rel, x) for x in refs)
        noise = max(_relation_distance(a, b) for i, a in enumerate(refs) for b in refs[i + 1:])
        limit = max(r.eval_inputs_floor, r.eval_inputs_factor * noise)
        if d <= limit:
            continue
        near = min(refs, key=lambda x: _relation_distance(rel, x))
        text = (f"the evaluation inputs relate to the training inputs otherwise than the reference's: per feature "
                f"(width {width}, {rel['features']} features), the evaluation mean less the training mean in "
                f"training deviations spans {rel['z'][0]:+.4f}..{rel['z'][-1]:+.4f} and the deviations' ratio "
                f"{rel['r'][0]:.4f}..{rel['r'][-1]:.4f}, where the nearest reference seed's span "
                f"{near['z'][0]:+.4f}..{near['z'][-1]:+.4f} and {near['r'][0]:.4f}..{near['r'][-1]:.4f}: distance "
                f"{d:.4f}, limit {limit:.4f} (floor {r.eval_inputs_floor}, or {r.eval_inputs_factor:g} x the "
                f"seeds' largest {noise:.4f}); the evaluation inputs are prepared another way than the training "
                "inputs (another split's statistics, or none)")
        return res.model_copy(update={
            "status": "failed",
            "details": {**(res.details or {}), "eval_inputs": {"width": width, "distance": round(d, 6),
                                                              "limit": round(limit, 6), "seeds_noise": round(noise, 6),
                                                              "seeds": len(refs)}},
            "evidence": f"{text} | {res.evidence}"})
    return res


def logged_noise(run: RunRecord, min_points: int) -> float | None:
    """The step-to-step noise of a run's logged loss: the median absolute second difference of its points after the
    first 20% (a straight trend cancels), relative to their median; None with fewer than `min_points` such points."""
    ys = [p.loss for p in run.loss_curve]
    ys = [y for y in ys[len(ys) // 5:] if math.isfinite(y)]
    if len(ys) < max(min_points, 3):
        return None
    d = sorted(abs(ys[i] - (ys[i - 1] + ys[i + 1]) / 2) for i in range(1, len(ys) - 1))
    level = sorted(ys)[len(ys) // 2]
    return d[len(d) // 2] / abs(level) if level else None


def _logged_noise(ctx: CheckContext, res: CheckResult) -> CheckResult:
    """A logged loss far smoother than every step's loss in the reference seeds (a running mean over many steps, an
    average since the epoch began) or far noisier (one step's loss where the reference logs a mean) is another
    quantity: its curve and window cannot be compared with the reference's, however close they look."""
    r = ctx.protocol.l1
    theirs = sorted(n for n in (logged_noise(x, r.noise_min_points) for x in seeds_for(ctx).same) if n)
    mine = logged_noise(ctx.run, r.noise_min_points)
    if mine is None or len(theirs) < 2:
        return res
    med = theirs[len(theirs) // 2]
    ratio = mine / med if med else None
    if ratio is None or 1 / r.noise_ratio_max <= ratio <= r.noise_ratio_max:
        return res
    what = ("smoother: a mean over many steps (a running mean, an average since the epoch began) logged for each "
            "step's loss" if ratio < 1 else "noisier: single steps' losses where the reference logs a mean over steps")
    text = (f"the logged loss's step-to-step noise is {ratio:.2f}x the reference seeds' median ({mine:.2e} against "
            f"{med:.2e}, the seeds {theirs[0]:.2e}-{theirs[-1]:.2e}; beyond {r.noise_ratio_max:g}x either way): the "
            f"run logs another quantity, {what}, so its curve is not the reference's")
    return res.model_copy(update={
        "status": "failed", "details": {**(res.details or {}), "logged_noise": {"run": mine, "baseline": theirs,
                                                                               "ratio": ratio}},
        "evidence": f"{text} | {res.evidence}"})


@register("L1", "trend")
def trend(ctx: CheckContext) -> CheckResult:
    ref = ctx.reference()
    if ref is None:
        return not_checked("L1", "trend", "no baseline run of this kind to compare with")
    p = ctx.protocol.l1
    t = trend_test(ctx.run.loss_curve, ref.loss_curve, p.trend_segments, p.trend_flat_tol, p.trend_near_flat)
    details = {"fixed_rule": None if t is None else {"agree": t.agree, "run_moves": t.run_moves,
                                                     "base_moves": t.base_moves}}
    fixed_text = ("fixed-rule trend: the run and the baseline share too few logged steps" if t is None
                  else f"fixed-rule trend: {t.describe()}")
    if calibrated_rule(ctx):
        from ladder.checks.stats import calibrated_curve

        v = calibrated_curve(ctx.run, seeds_for(ctx), ctx.protocol)
        return _logged_noise(ctx, _calibrated("trend", ctx, v, v.measured, fixed_text, details))
    if t is None:
        return not_checked("L1", "trend", f"the run and the baseline share too few logged steps to compare trends "
                                          f"({len(ctx.run.loss_curve)} and {len(ref.loss_curve)} loss points): log the "
                                          "loss more often")
    return CheckResult(level="L1", name="trend", status="passed" if t.agree else "failed", measured=t.run_classes,
                       threshold=t.base_classes, evidence=t.describe() + " | the protocol's rule is the fixed rule",
                       details=details)
