"""Calibrated verdicts: is a run different from the baseline beyond the baseline seeds' own noise?

Owns the statistical rule behind L1 (and L3's band). Must not read files or run anything: it judges
RunRecords it is given. Every number it uses comes from the protocol's [calibrated] section.

The rule (one quantity x: a loss-window mean, a metric, or a block of the loss curve)
  The baseline's K seeds give x_1..x_K with mean m and sample sd s. A faithful run is one more draw
  from the same distribution, so under normality (x - m) / (s * sqrt(1 + 1/K)) follows Student's t
  with K - 1 degrees of freedom: the two-sided prediction interval
      m +- t(1 - alpha / (2 n), K - 1) * max(s, floor) * sqrt(1 + 1/K)
  is the band, where n is the number of quantities one check tests (Bonferroni) and
  floor = floor_rel * |m| keeps three seeds that happen to agree closely from making a band of zero.
  Outside the band: failed, whichever side (a silent fault can improve a metric).
  Inside the band, but outside the band that max_seeds seeds with the same spread would give: the
  seeds cannot tell yet, so the verdict is undecided, and it asks for the seeds that bring the baseline
  to max_seeds. Inside both: passed. Few seeds therefore never pass a run by their width alone. A
  borderline run is thus judged at most twice (with the seeds it had, then with max_seeds): asking for
  one seed at a time would re-test it at every seed, and each look adds its own false alarms.

Seeds that do not vary. Runs that are bit-identical (a program that seeds itself from a constant, run
without `{seed}` or `[probe] seed`) carry no noise estimate: the verdict is not_checked with that reason,
never a band made of the floor alone.

A full run with fewer than min_seeds full seeds borrows its spread from the short seeds: the same
quantity's relative sd over the short seeds, scaled to the full seeds' mean, with the short seeds'
degrees of freedom; the evidence says so. Without enough seeds of either kind the verdict is undecided.

Margins. Each quantity has a margin (a fraction of the seeds' mean, protocol [calibrated] *_margin_rel):
the band is never narrower than it. A difference must be both beyond the seeds' noise and beyond what
the protocol calls near; with NCSU that is its own 5% / 1%.

The curve check. Every curve (the seeds' and the run's) is put on the baseline's logged steps over the
common range (linear interpolation), smoothed with a centred moving average over smoothing_fraction
of the points (at least 3, shrinking at the ends), and cut into equal blocks of points: curve_segments
of them, fewer when the log has few points (at least 2 points per block); fewer than 2 blocks is
not_checked (log the loss more often). Each block's mean is one quantity of the rule above. The per-step
envelope is reported as evidence: where the run first leaves it. A non-finite loss in the run fails.
The first logged loss (the initialisation) is compared apart and reported as a finding, not a verdict.

The gradient-norm curve. The probe records, at each optimizer step, the global norms of the gradient the
optimizer receives and of the parameters, and, where the program clips by global norm, the norm before
clipping. When the run and at least two seeds carry them, the curve check judges the scale-free
gradient norm ||g|| x ||theta|| too (behind a normalisation layer the gradient scales as 1 / the weights'
scale), block by block with the same rule, never narrower than grad_norm_margin_rel, after its first
grad_norm_skip_fraction of steps, and not where clipping binds in the run or a seed (there the optimizer
receives the clip threshold, whatever the gradient). The check's alpha is split between the two curves.
It sees the faults an adaptive optimizer hides from the loss: gradients summed instead of averaged,
clipped per shard.

The evaluations during training. The metric check of a short run also judges each evaluation it logs
during training against the short seeds' values at that step (steps shared with at least max(5, min_seeds)
seeds, after the first eval_skip_fraction of the run's steps), alpha split over them, never narrower than
eval_margin_rel: an evaluation that scores other weights than training produced (a stale copy of the model)
moves them while the final metric, late in a decayed schedule, may not. The margin is there because
mid-training evaluations are heavy-tailed (loss spikes). The metric is its own name in the evaluation lines,
or their one value.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

import numpy as np
from scipy import stats as _sp

from ladder.checks.compare import curve_arrays, window_mean
from ladder.runs.records import RunRecord

if TYPE_CHECKING:
    from ladder.migration.protocol import CalibratedRules, Protocol

MIN_POINTS_PER_BLOCK = 4  # a block averages at least 4 logged points: with fewer, one unlucky logged value
# (a sparse log of heavy-tailed batch losses) decides the block (measured on the corpus dev set, benchmarks/detection)


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with df degrees of freedom (scipy)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} outside (0, 1)")
    return float(_sp.t.ppf(q, df))


# ------------------------------------------------------------------ the rule on one quantity

@functools.lru_cache(maxsize=4096)
def _t(k_df: int, alpha: float, n_tests: int) -> float:
    return t_quantile(1.0 - alpha / (2.0 * n_tests), k_df - 1)


def _crit(k: int, alpha: float, n_tests: int) -> float:
    """Half-width of the prediction band in units of the (floored) sd, for k seeds."""
    return _t(k, alpha, n_tests) * math.sqrt(1.0 + 1.0 / k)


@dataclass(frozen=True)
class Borrowed:
    """A spread taken from the other kind's seeds: their relative sd and how many they were."""

    rel_sd: float
    seeds: int
    kind: str = "short"


@dataclass(frozen=True)
class Decision:
    passed: bool | None
    value: float
    mean: float
    sd: float
    sd_used: float
    lo: float
    hi: float
    seeds: int
    z: float  # |value - mean| in band half-widths: > 1 is outside
    more_seeds: int = 0  # undecided: the extra seeds that would decide
    borrowed: Borrowed | None = None

    def band(self) -> dict[str, Any]:
        out = {"mean": self.mean, "lo": self.lo, "hi": self.hi, "sd": self.sd, "sd_used": self.sd_used,
               "seeds": self.seeds}
        if self.borrowed:
            out["spread_from"] = {"kind": self.borrowed.kind, "seeds": self.borrowed.seeds,
                                  "rel_sd": self.borrowed.rel_sd}
        return out


def decide(value: float, values: list[float], floor_rel: float, rules: "CalibratedRules",
           n_tests: int = 1, margin_rel: float = 0.0, borrowed: Borrowed | None = None) -> Decision:
    """Judge one quantity against the seeds' values by the module's rule.

    Needs >= 2 finite seed values, or >= 1 with a borrowed spread. margin_rel: the smallest difference that
    counts (a fraction of the seeds' mean): the band is never narrower than it.
    """
    vals = np.array([v for v in values if math.isfinite(v)], dtype=float)
    k = len(vals)
    if k < (1 if borrowed else 2):
        raise ValueError("the rule needs at least 2 finite seed values (1 with a borrowed spread)")
    m = float(vals.mean())
    if borrowed is None:
        sd = float(vals.std(ddof=1))
        k_df, grow_to = k, rules.max_seeds
        crit = _crit(k, rules.alpha, n_tests)
        crit_max = _crit(rules.max_seeds, rules.alpha, n_tests) if k < rules.max_seeds else crit
    else:
        sd = borrowed.rel_sd * abs(m)
        k_df, grow_to = borrowed.seeds, rules.min_seeds
        crit = _t(borrowed.seeds, rules.alpha, n_tests) * math.sqrt(1.0 + 1.0 / k)
        crit_max = _t(borrowed.seeds, rules.alpha, n_tests) * math.sqrt(1.0 + 1.0 / max(k, rules.min_seeds))
    sd_used = max(sd, floor_rel * abs(m))
    margin = margin_rel * abs(m)
    if sd_used == 0.0 and margin == 0.0:  # all seeds exactly 0, no floor, no margin: only an exact match
        ok = value == m
        return Decision(ok, value, m, sd, 0.0, m, m, k, 0.0 if ok else math.inf, borrowed=borrowed)
    half = max(crit * sd_used, margin)
    dist = abs(value - m)
    z = dist / half if math.isfinite(value) else math.inf
    if not math.isfinite(value) or dist > half:
        return Decision(False, value, m, sd, sd_used, m - half, m + half, k, z, borrowed=borrowed)
    more = 0
    if k < grow_to and dist > max(crit_max * sd_used, margin):
        # Ask for max_seeds, not the fewest seeds that might decide: re-testing a borderline run at every
        # added seed is sequential testing, and inflates false alarms (measured: benchmarks/detection).
        more = grow_to - k
    del k_df
    return Decision(None if more else True, value, m, sd, sd_used, m - half, m + half, k, z, more, borrowed)


# ------------------------------------------------------------------ verdicts

@dataclass(frozen=True)
class Verdict:
    """A calibrated verdict: passed True / False / None (undecided, `more_seeds` would decide), or blocked
    (not_checked: the seeds give no noise estimate, or the run has too few points to judge)."""

    check: str
    passed: bool | None
    measured: Any
    band: dict[str, Any]
    seeds: int
    rule: str
    summary: str
    more_seeds: int = 0
    details: dict[str, Any] = field(default_factory=dict)
    blocked: str | None = None

    @property
    def status(self) -> str:
        if self.blocked:
            return "not_checked"
        return "passed" if self.passed else "failed" if self.passed is not None else "undecided"

    def explain(self) -> str:
        if self.blocked:
            return f"calibrated {self.check}: not checked: {self.blocked}"
        tail = (f"undecided: {self.more_seeds} more baseline seed(s) would decide" if self.passed is None
                else "within noise" if self.passed else "different beyond noise")
        return f"calibrated {self.check} ({self.seeds} seeds; {self.rule}): {self.summary} -> {tail}"

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "passed": self.passed, "status": self.status, "measured": self.measured,
                "band": self.band, "seeds": self.seeds, "rule": self.rule, "summary": self.summary,
                "more_seeds": self.more_seeds, "details": self.details, "blocked": self.blocked,
                "explain": self.explain()}


def _rule_text(rules: "CalibratedRules", floor_rel: float, n_tests: int = 1, margin_rel: float = 0.0,
               borrowed: Borrowed | None = None) -> str:
    per = f"alpha {rules.alpha:g}" + (f"/{n_tests} per block" if n_tests > 1 else "")
    tail = f", never narrower than +-{margin_rel:.0%}" if margin_rel else ""
    spread = (f", spread from the {borrowed.seeds} {borrowed.kind} seeds (relative sd {borrowed.rel_sd:.2%})"
              if borrowed else "")
    return f"two-sided t prediction band, {per}, sd floor {floor_rel:.2%} of the mean{tail}{spread}"


def too_few(check: str, k: int, rules: "CalibratedRules", why: str) -> Verdict:
    need = max(2, rules.min_seeds) - k
    return Verdict(check, None, None, {"seeds": k}, k, "needs seeds", why, more_seeds=max(need, 1))


IDENTICAL = ("no noise estimate: the baseline's {k} runs are identical, so their spread is zero; pass {{seed}} "
             "in the command, or set [probe] seed = true for a program that seeds itself from a constant, then "
             "re-record the baseline")


def identical_runs(seeds: list[RunRecord]) -> bool:
    """Runs that came out bit-identical (loss curve and metric): no noise to calibrate on."""
    if len(seeds) < 2:
        return False
    first = seeds[0]
    key = ([(p.step, p.loss) for p in first.loss_curve], first.metric)
    return all(([(p.step, p.loss) for p in s.loss_curve], s.metric) == key for s in seeds[1:])


def _blocked(check: str, seeds: list[RunRecord]) -> Verdict:
    return Verdict(check, None, None, {"seeds": len(seeds)}, len(seeds), "no noise estimate", "",
                   blocked=IDENTICAL.format(k=len(seeds)))


def _nonfinite(run: RunRecord) -> list[int]:
    bad = [p.step for p in run.nonfinite_losses]
    bad += [p.step for p in run.loss_curve if not math.isfinite(p.loss)]
    return sorted(set(bad))


def _finite_curve(run: RunRecord) -> bool:
    return bool(run.loss_curve) and all(math.isfinite(p.loss) for p in run.loss_curve)


def _from_decision(check: str, d: Decision, rules: "CalibratedRules", floor_rel: float, what: str,
                   direction: str | None = None, details: dict[str, Any] | None = None,
                   margin_rel: float = 0.0) -> Verdict:
    side = ""
    if direction is not None and d.value != d.mean:
        better = (d.value > d.mean) == (direction == "max")
        side = f", {'better' if better else 'worse'} than the seeds' mean"
    summary = (f"{what} {d.value:.6g} vs seeds' mean {d.mean:.6g} (sd {d.sd:.3g}, used {d.sd_used:.3g}); "
               f"band [{d.lo:.6g}, {d.hi:.6g}], distance {d.z:.2f} band half-widths{side}")
    return Verdict(check, d.passed, d.value, d.band(), d.seeds,
                   _rule_text(rules, floor_rel, margin_rel=margin_rel, borrowed=d.borrowed),
                   summary, d.more_seeds, details or {})


@dataclass(frozen=True)
class Seeds:
    """The baseline runs a quantity is judged against: the same kind's seeds, and the other kind's (to
    borrow a spread from when the same kind has fewer than min_seeds)."""

    same: list[RunRecord]
    other: list[RunRecord] = field(default_factory=list)
    other_kind: str = "short"


def _as_seeds(seeds: "list[RunRecord] | Seeds") -> Seeds:
    return seeds if isinstance(seeds, Seeds) else Seeds(list(seeds))


def _rel_sd(values: list[float]) -> float | None:
    vals = [v for v in values if math.isfinite(v)]
    if len(vals) < 2 or np.mean(vals) == 0:
        return None
    return float(np.std(vals, ddof=1) / abs(np.mean(vals)))


def _scalar_verdict(check: str, value: float, same: list[float], other: list[float], s: Seeds, floor_rel: float,
                    margin_rel: float, rules: "CalibratedRules", what: str, direction: str | None = None) -> Verdict:
    if len(s.same) >= 2 and identical_runs(s.same):
        return _blocked(check, s.same)
    borrowed = None
    if len(same) < rules.min_seeds:
        rel = _rel_sd(other)
        if same and rel is not None and len(other) >= rules.min_seeds and not identical_runs(s.other):
            borrowed = Borrowed(rel, len(other), s.other_kind)
        elif len(same) < 2 or rules.min_seeds > len(same):
            return too_few(check, len(same), rules,
                           f"{len(same)} baseline seed(s) of this kind and no spread to borrow "
                           f"({len(other)} of the other kind)")
    d = decide(value, same, floor_rel, rules, margin_rel=margin_rel, borrowed=borrowed)
    return _from_decision(check, d, rules, floor_rel, what, direction=direction,
                          details={"seed_values": same, **({"borrowed_from": other} if borrowed else {})},
                          margin_rel=margin_rel)


def calibrated_loss_window(run: RunRecord, seeds: "list[RunRecord] | Seeds", protocol: "Protocol") -> Verdict:
    """The mean loss over the protocol's last window fraction of steps, against the seeds' spread."""
    s = _as_seeds(seeds)
    rules, frac = protocol.calibrated, protocol.l1.window_fraction
    bad = _nonfinite(run)
    if bad:
        return Verdict("loss_window", False, None, {}, len(s.same), "non-finite loss",
                       f"the run logged a non-finite loss at step {bad[0]} ({len(bad)} such steps)")
    mine = window_mean(run.loss_curve, frac)
    if mine is None:
        return Verdict("loss_window", False, None, {}, len(s.same), "no loss", "the run logged no loss")

    def values(runs: list[RunRecord]) -> list[float]:
        return [v for v in (window_mean(r.loss_curve, frac) for r in runs if _finite_curve(r)) if v is not None]

    return _scalar_verdict("loss_window", mine, values(s.same), values(s.other), s, rules.loss_floor_rel,
                           rules.loss_margin_rel, rules, f"mean loss over the last {frac:.0%}")


def calibrated_metric(run: RunRecord, seeds: "list[RunRecord] | Seeds", protocol: "Protocol") -> Verdict:
    """The headline metric against the seeds' spread, two-sided; the report says better or worse."""
    s = _as_seeds(seeds)
    rules = protocol.calibrated
    if run.metric is None or not math.isfinite(run.metric):
        return Verdict("metric", False, run.metric, {}, len(s.same), "no metric",
                       f"the run reported no finite {run.metric_name or 'metric'}")

    def values(runs: list[RunRecord]) -> list[float]:
        return [r.metric for r in runs if r.metric is not None and math.isfinite(r.metric)]

    v = _scalar_verdict("metric", run.metric, values(s.same), values(s.other), s, rules.metric_floor_rel,
                        rules.metric_margin_rel, rules, run.metric_name or "metric", run.metric_direction)
    if v.blocked or v.passed is False:
        return v
    ev = calibrated_evaluations(run, s.same, rules)
    if ev is None:
        return v
    worst, judged, more = ev
    details = {**v.details, "evaluations": {"judged": judged, "worst": worst}}
    text = (f"{len(judged)} evaluation(s) during training (steps {', '.join(str(j['step']) for j in judged[:8])}"
            f"{' ...' if len(judged) > 8 else ''}), each against the seeds' values at its step, alpha "
            f"{rules.alpha:g}/{len(judged)} each")
    if worst["passed"] is False:
        return replace(v, passed=False, more_seeds=0, details=details,
                       summary=(f"{v.summary}; but the evaluation at step {worst['step']} is {worst['value']:.6g} "
                                f"against the seeds' {worst['mean']:.6g} there (band [{worst['lo']:.6g}, "
                                f"{worst['hi']:.6g}], distance {worst['z']:.2f} band half-widths): what the evaluations "
                                f"score during training differs ({text})"))
    if more and v.passed:
        return replace(v, passed=None, more_seeds=more, details=details,
                       summary=f"{v.summary}; the evaluation at step {worst['step']} is borderline ({text})")
    return replace(v, details=details, summary=f"{v.summary}; {text}: within noise")


def _eval_key(run: RunRecord) -> str | None:
    """The key of the run's evaluation lines that carries the metric: the metric's own name, else the one value."""
    keys = {k for e in run.evals for k in e.values}
    if run.metric_name and run.metric_name in keys:
        return run.metric_name
    return next(iter(keys)) if len(keys) == 1 else None


def _eval_series(run: RunRecord, key: str) -> dict[int, float]:
    out: dict[int, float] = {}
    for e in run.evals:
        if e.step is not None and key in e.values and math.isfinite(e.values[key]):
            out.setdefault(e.step, e.values[key])  # an evaluation logged twice at one step: the first
    return out


def calibrated_evaluations(run: RunRecord, seeds: list[RunRecord], rules: "CalibratedRules"
                           ) -> tuple[dict[str, Any], list[dict[str, Any]], int] | None:
    """The short run's evaluations logged during training, each against the short seeds' values at its step
    (the steps the run and at least max(5, min_seeds) seeds share, past the first eval_skip_fraction of the
    run's steps, where ports legitimately follow another initialisation, and before its last logged step, the
    final metric's), alpha split over them, never narrower than eval_margin_rel. Mid-training evaluations are
    heavy-tailed (a loss spike at a high rate: one of 11 seeds of a regression 38% above the others at one
    evaluation, measured on benchmarks/ports), which a normal band from few seeds does not cover: hence the
    margin, the five seeds, and no judgement of the full run's (its 3 default seeds; the final metric and L3
    judge it). An evaluation that scores other weights than training produced (a stale copy of the model)
    moves here while the final metric may not. (worst, judged, more seeds) or None when no evaluation can be
    judged."""
    key = _eval_key(run)
    if key is None or run.kind != "short":
        return None
    mine = _eval_series(run, key)
    last = max((p.step for p in run.loss_curve), default=0) or max(mine, default=0)
    theirs = [_eval_series(r, key) for r in seeds if _eval_key(r) == key]
    need = max(5, rules.min_seeds)
    # the evaluation at the end of training is the final metric's, judged above
    steps = [st for st in sorted(mine) if rules.eval_skip_fraction * last < st < last
             and sum(st in t for t in theirs) >= need]
    if not steps:
        return None
    judged, more = [], 0
    for st in steps:
        d = decide(mine[st], [t[st] for t in theirs if st in t], rules.metric_floor_rel, rules, n_tests=len(steps),
                   margin_rel=max(rules.metric_margin_rel, rules.eval_margin_rel))
        judged.append({"step": st, "value": d.value, "mean": d.mean, "lo": d.lo, "hi": d.hi, "z": d.z,
                       "seeds": d.seeds, "passed": d.passed})
        more = max(more, d.more_seeds)
    worst = max(judged, key=lambda j: j["z"])
    return worst, judged, more


def smooth(values: np.ndarray, fraction: float) -> np.ndarray:
    """Centred moving average over `fraction` of the points (odd, at least 3), shrinking at the ends."""
    n = len(values)
    w = max(3, int(round(fraction * n)))
    w += 1 - w % 2
    half = w // 2
    csum = np.concatenate([[0.0], np.cumsum(values)])
    idx = np.arange(n)
    lo, hi = np.maximum(idx - half, 0), np.minimum(idx + half + 1, n)
    return (csum[hi] - csum[lo]) / (hi - lo)


def grad_norm_series(run: RunRecord, scale_free: bool = False) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """The probe's gradient norms (step, norm the optimizer received, clipping binds?), sorted by step;
    None when the probe recorded none.

    scale_free: the gradient norm times the parameter norm, ||g|| * ||theta||: None when the probe recorded
    no parameter norm. Behind a normalisation layer the gradient scales as 1 / the weights' scale, so
    this product does not move with the init distribution's scale, which ports change legitimately.
    """
    gn = (run.probe or {}).get("grad_norms") or {}
    pts = gn.get("values") or []
    if not pts or (scale_free and any(len(p) < 3 or p[2] is None for p in pts)):
        return None
    clip = (gn.get("clip") or {}).get("max_norm")
    steps = np.array([float(p[0]) for p in pts])
    vals = np.array([float(p[1]) for p in pts])  # "nan"/"inf" were stored as text: float() reads them
    pre = np.array([float(p[3]) if len(p) > 3 and p[3] is not None else np.nan for p in pts])
    binds = (pre > float(clip) * 1.0001) if clip is not None else np.zeros(len(pts), dtype=bool)
    if scale_free:
        vals = vals * np.array([float(p[2]) for p in pts])
    order = np.argsort(steps, kind="stable")
    return steps[order], vals[order], binds[order]


@dataclass
class _CurveJudgement:
    passed: bool | None
    more: int
    decisions: list[Decision]
    grid: np.ndarray
    blocks: list[np.ndarray]
    mean: np.ndarray
    half: np.ndarray
    mine: np.ndarray
    coverage: float
    seeds: int
    complete: bool = True  # the run reaches the seeds' last step (within one sampling gap)
    excluded: int = 0  # grid points not judged (clipping binds)

    @property
    def worst(self) -> int:
        return max(range(len(self.decisions)), key=lambda i: self.decisions[i].z)

    @property
    def first_out(self) -> int | None:
        outside = np.nonzero(np.abs(self.mine - self.mean) > self.half)[0]
        return int(self.grid[outside[0]]) if len(outside) else None

    def summary(self, what: str) -> str:
        w, i, first = self.decisions[self.worst], self.worst, self.first_out
        b = self.blocks[i]
        return (f"{what}: worst of {len(self.decisions)} blocks is #{i + 1} (steps {int(self.grid[b[0]])}-"
                f"{int(self.grid[b[-1]])}): run {w.value:.5g} vs band [{w.lo:.5g}, {w.hi:.5g}], distance "
                f"{w.z:.2f} half-widths; smoothed curve "
                + (f"first leaves the per-step envelope at step {first}" if first is not None
                   else "stays inside the per-step envelope")
                + ("" if self.complete else f"; the run covers only {self.coverage:.0%} of the seeds' steps")
                + (f"; {self.excluded} steps where clipping binds not judged" if self.excluded else ""))

    def band(self) -> dict[str, Any]:
        return {"steps": self.grid.astype(int).tolist(), "mean": self.mean.tolist(),
                "lo": (self.mean - self.half).tolist(), "hi": (self.mean + self.half).tolist(),
                "run": self.mine.tolist(),
                "blocks": [{**d.band(), "value": d.value, "z": d.z, "status":
                            {True: "passed", False: "failed", None: "undecided"}[d.passed]} for d in self.decisions]}

    def measured(self) -> dict[str, Any]:
        outside = int(np.count_nonzero(np.abs(self.mine - self.mean) > self.half))
        return {"worst_block": self.worst + 1, "z": self.decisions[self.worst].z,
                "first_step_outside": self.first_out, "steps_outside": outside, "coverage": self.coverage}


def _combine(parts: list[tuple[bool | None, int]]) -> tuple[bool | None, int]:
    """(passed, more seeds) of several decisions: any failure fails; else any undecided is undecided."""
    if any(p is False for p, _ in parts):
        return False, 0
    if any(p is None for p, _ in parts):
        return None, max(m for p, m in parts if p is None)
    return True, 0


def blocks_for(points: int, rules: "CalibratedRules") -> int:
    """How many blocks a curve of this many shared points is cut into: curve_segments, fewer for a sparse
    log (at least MIN_POINTS_PER_BLOCK points each)."""
    return min(rules.curve_segments, points // MIN_POINTS_PER_BLOCK)


def _judge_curve(mine_xy: tuple, seeds_xy: list[tuple], rules: "CalibratedRules", floor_rel: float, n_tests: int,
                 margin_rel: float = 0.0, skip_fraction: float = 0.0, require_complete: bool = True,
                 borrowed_rel: float | None = None, borrowed_seeds: int = 0,
                 shared_grid: bool = False) -> _CurveJudgement | str:
    """Block-by-block verdict of one curve against the seeds' curves; a reason string when it cannot judge.
    A curve is (steps, values) or (steps, values, excluded-mask). skip_fraction: the first part of the
    seeds' steps is not judged. require_complete: a curve that ends (or starts) more than one sampling gap
    from the seeds' fails. borrowed_rel: judge against one or two seeds with this relative sd per block.
    shared_grid: judge on the steps every curve sampled, when they are most of the sparsest curve's (a
    series thinned to every k-th step under load: its samples, not interpolations between them)."""
    base_grid = seeds_xy[0][0]
    if shared_grid:
        common = base_grid
        for xy in [mine_xy, *seeds_xy[1:]]:
            common = np.intersect1d(common, xy[0])
        sparsest = min(len(xy[0]) for xy in [mine_xy, *seeds_xy])
        if len(common) >= 2 * MIN_POINTS_PER_BLOCK and len(common) >= 0.5 * sparsest:
            base_grid = common
    start = base_grid[0] + skip_fraction * (base_grid[-1] - base_grid[0])
    lo = max([s[0][0] for s in seeds_xy] + [mine_xy[0][0], start])
    hi = min([s[0][-1] for s in seeds_xy] + [mine_xy[0][-1]])
    base_grid = base_grid[base_grid >= start]
    grid = base_grid[(base_grid >= lo) & (base_grid <= hi)]
    excluded = np.zeros(len(grid), dtype=bool)
    for xy in [mine_xy, *seeds_xy]:
        if len(xy) > 2 and len(grid):
            excluded |= np.interp(grid, xy[0], xy[2].astype(float)) > 0.5
    n_ex = int(excluded.sum())
    grid_all = grid
    grid = grid[~excluded]
    nseg = blocks_for(len(grid), rules)
    if nseg < 2:
        why = f"the run and the seeds share {len(grid)} logged steps"
        if n_ex:
            why += f" where clipping does not bind ({n_ex} where it does)"
        return why + f", too few for 2 blocks of {MIN_POINTS_PER_BLOCK}"
    coverage = float((hi - lo) / max(1e-12, base_grid[-1] - base_grid[0]))
    # a curve sampled every k steps may end up to k steps before another (a thinned gradient-norm series
    # ends at 996 where a seed has 1000): within one sampling gap of the seeds' ends it covers them
    gap = max(float(np.max(np.diff(x[0][-10:]))) if len(x[0]) > 1 else 0.0 for x in [mine_xy, *seeds_xy])
    complete = (base_grid[-1] - hi) <= gap and (lo - base_grid[0]) <= gap
    frac = rules.smoothing_fraction
    seed_curves = np.stack([smooth(np.interp(grid_all, x[0], x[1]), frac)[~excluded] for x in seeds_xy])
    mine = smooth(np.interp(grid_all, mine_xy[0], mine_xy[1]), frac)[~excluded]
    blocks = np.array_split(np.arange(len(grid)), nseg)
    n_tests = max(n_tests, nseg)
    borrowed = Borrowed(borrowed_rel, borrowed_seeds) if borrowed_rel is not None else None
    decisions = [decide(float(mine[b].mean()), [float(c[b].mean()) for c in seed_curves], floor_rel, rules,
                        n_tests=n_tests, margin_rel=margin_rel, borrowed=borrowed) for b in blocks]
    passed, more = _combine([(d.passed, d.more_seeds) for d in decisions])
    if require_complete and not complete and passed:
        passed = False  # a run that stops early has not reproduced the curve, however close its start
    k = len(seeds_xy)
    mean = seed_curves.mean(axis=0)
    if borrowed is None:
        sd = seed_curves.std(axis=0, ddof=1)
        crit = _crit(k, rules.alpha, n_tests)
    else:
        sd = borrowed.rel_sd * np.abs(mean)
        crit = _t(borrowed.seeds, rules.alpha, n_tests) * math.sqrt(1.0 + 1.0 / k)
    half = np.maximum(crit * np.maximum(sd, floor_rel * np.abs(mean)), margin_rel * np.abs(mean))
    return _CurveJudgement(passed, more, decisions, grid, blocks, mean, half, mine, coverage, k, complete, n_ex)


def _scale_free(run: RunRecord, seeds: list[RunRecord]) -> bool:
    """Judge ||g|| x ||theta|| when the run and every seed with gradient norms also carry parameter norms."""
    return grad_norm_series(run, True) is not None and all(grad_norm_series(s, True) is not None
                                                           for s in seeds if grad_norm_series(s) is not None)


def _grad_norm_part(run: RunRecord, seeds: list[RunRecord], rules: "CalibratedRules", n_tests: int,
                    scale_free: bool, borrowed: tuple[float, int] | None) -> _CurveJudgement | str:
    mine = grad_norm_series(run, scale_free)
    need = 1 if borrowed else 2
    theirs = [x for x in (grad_norm_series(s, scale_free) for s in seeds) if x is not None
              and np.isfinite(x[1]).all() and len(x[0]) >= 2 * MIN_POINTS_PER_BLOCK]
    if len(theirs) < need:
        return f"not compared: fewer than {need} baseline seeds carry gradient norms (re-record the baseline)"
    if mine is None:
        why = ((run.probe or {}).get("grad_norms") or {}).get("why_missing")
        return ("not compared: the run's probe recorded no gradient norm"
                + (f" ({why})" if why else " (no torch optimizer step or optax optimizer was seen)"))
    bad = np.nonzero(~np.isfinite(mine[1]))[0]
    if len(bad):
        return f"non-finite gradient norm at step {int(mine[0][bad[0]])} ({len(bad)} such steps)"
    # The series may be thinned (the probe's budget) and end a few steps early: whether the run stopped
    # early is the loss curve's to judge.
    return _judge_curve(mine, theirs, rules, rules.curve_floor_rel, n_tests, margin_rel=rules.grad_norm_margin_rel,
                        skip_fraction=rules.grad_norm_skip_fraction, require_complete=False,
                        borrowed_rel=borrowed[0] if borrowed else None, borrowed_seeds=borrowed[1] if borrowed else 0,
                        shared_grid=True)


def _curve_rel_sd(runs: list[RunRecord], rules: "CalibratedRules", series=None) -> float | None:
    """The median relative sd of the blocks of some seeds' curves: the spread a full run borrows."""
    curves = [series(r) if series else curve_arrays(r.loss_curve) for r in runs]
    curves = [c for c in curves if c is not None and len(c[0]) >= 2 * MIN_POINTS_PER_BLOCK]
    if len(curves) < 2:
        return None
    grid = curves[0][0]
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    grid = grid[(grid >= lo) & (grid <= hi)]
    nseg = blocks_for(len(grid), rules)
    if nseg < 2:
        return None
    ys = np.stack([smooth(np.interp(grid, c[0], c[1]), rules.smoothing_fraction) for c in curves])
    rels = [float(ys[:, b].mean(axis=1).std(ddof=1) / abs(ys[:, b].mean())) for b in
            np.array_split(np.arange(len(grid)), nseg) if ys[:, b].mean() != 0]
    return float(np.median(rels)) if rels else None


def initialisation(run: RunRecord, seeds: list[RunRecord], rules: "CalibratedRules") -> dict[str, Any] | None:
    """The first logged loss against the seeds' first logged losses: a finding (another init distribution
    is a legitimate port choice), reported apart from the verdict."""
    firsts = [s.loss_curve[0].loss for s in seeds if s.loss_curve and math.isfinite(s.loss_curve[0].loss)]
    if not run.loss_curve or len(firsts) < 2 or not math.isfinite(run.loss_curve[0].loss):
        return None
    d = decide(run.loss_curve[0].loss, firsts, rules.curve_floor_rel, rules, margin_rel=rules.curve_margin_rel)
    return {"differs": d.passed is False, "step": run.loss_curve[0].step, "run": d.value, "seeds_mean": d.mean,
            "band": [d.lo, d.hi], "seeds": d.seeds}


def calibrated_curve(run: RunRecord, seeds: "list[RunRecord] | Seeds", protocol: "Protocol") -> Verdict:
    """The smoothed loss curve, block by block, against the seeds' per-block spread; and, when the run and
    the seeds carry the probe's gradient norms, the gradient-norm curve the same way (the check's alpha
    is then split between the two curves)."""
    s = _as_seeds(seeds)
    rules = protocol.calibrated
    bad = _nonfinite(run)
    if bad:
        return Verdict("curve", False, None, {}, len(s.same), "non-finite loss",
                       f"the run logged a non-finite loss at step {bad[0]} ({len(bad)} such steps)")
    usable = [r for r in s.same if _finite_curve(r) and len(r.loss_curve) >= 2 * MIN_POINTS_PER_BLOCK]
    if len(usable) >= 2 and identical_runs(usable):
        return _blocked("curve", usable)
    borrowed_loss = borrowed_gn = None
    if len(usable) < rules.min_seeds:
        other = [r for r in s.other if _finite_curve(r)]
        rel = _curve_rel_sd(other, rules) if len(other) >= rules.min_seeds and not identical_runs(other) else None
        if not usable or rel is None:
            return too_few("curve", len(usable), rules, f"{len(usable)} baseline seed(s) of this kind with a finite "
                                                        f"loss curve and no spread to borrow")
        borrowed_loss = (rel, len(other))
        rel_gn = _curve_rel_sd(other, rules, lambda r: grad_norm_series(r, _scale_free(run, other)))
        borrowed_gn = (rel_gn, len(other)) if rel_gn is not None else None
    if len(run.loss_curve) < 2 * MIN_POINTS_PER_BLOCK:
        return Verdict("curve", None, None, {}, len(usable), "too few points", "",
                       blocked=f"the run logged {len(run.loss_curve)} loss points: too few to compare a curve; log "
                               "the loss more often, or rely on the loss window and the metric")
    both = grad_norm_series(run) is not None and sum(grad_norm_series(r) is not None for r in usable) >= (
        1 if borrowed_loss else 2)
    n_tests = rules.curve_segments * (2 if both else 1)
    loss = _judge_curve(curve_arrays(run.loss_curve), [curve_arrays(r.loss_curve) for r in usable], rules,
                        rules.curve_floor_rel, n_tests, margin_rel=rules.curve_margin_rel,
                        borrowed_rel=borrowed_loss[0] if borrowed_loss else None,
                        borrowed_seeds=borrowed_loss[1] if borrowed_loss else 0)
    if isinstance(loss, str):
        return Verdict("curve", None, None, {}, len(usable), "too few points", "",
                       blocked=loss + ": log the loss more often to compare curves")
    scale_free = _scale_free(run, usable)
    if borrowed_loss and borrowed_gn is None:
        gn: _CurveJudgement | str = "not compared: no gradient-norm spread to borrow from the short seeds"
    else:
        gn = _grad_norm_part(run, usable, rules, n_tests, scale_free, borrowed_gn)
    parts = [(loss.passed, loss.more)] + ([(gn.passed, gn.more)] if isinstance(gn, _CurveJudgement) else
                                          [(False, 0)] if gn.startswith("non-finite") else [])
    passed, more = _combine(parts)
    label = "scale-free gradient-norm curve (||g|| x ||theta||)" if scale_free else "gradient-norm curve"
    summary = loss.summary("loss curve") + " || " + (gn.summary(label) if isinstance(gn, _CurveJudgement)
                                                    else f"gradient-norm curve: {gn}")
    measured = loss.measured()
    details: dict[str, Any] = {}
    init = initialisation(run, usable, rules)
    if init is not None:
        details["initialisation"] = init
    if isinstance(gn, _CurveJudgement):
        measured["grad_norm"] = gn.measured()
        details["grad_norm"] = {"passed": gn.passed, "band": gn.band(), "what": label,
                                "margin_rel": rules.grad_norm_margin_rel, "skip_fraction": rules.grad_norm_skip_fraction,
                                "excluded_clipping": gn.excluded,
                                "source": ((run.probe or {}).get("grad_norms") or {}).get("source")}
    else:
        details["grad_norm"] = {"passed": False if gn.startswith("non-finite") else None, "why": gn}
    borrowed = Borrowed(*borrowed_loss, kind=s.other_kind) if borrowed_loss else None
    rule = (_rule_text(rules, rules.curve_floor_rel, n_tests, rules.curve_margin_rel, borrowed)
            + f", {len(loss.blocks)} blocks after a {rules.smoothing_fraction:.0%} moving average"
            + (f"; gradient norms: never narrower than +-{rules.grad_norm_margin_rel:.0%}, the first "
               f"{rules.grad_norm_skip_fraction:.0%} of steps and steps where clipping binds not judged"
               if isinstance(gn, _CurveJudgement) else ""))
    return Verdict("curve", passed, measured, loss.band(), len(usable), rule, summary, more, details)
