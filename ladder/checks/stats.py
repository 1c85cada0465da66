"""Calibrated verdicts: is a run different from the baseline beyond the baseline seeds' own noise?

Owns the statistical rule behind L1 (and L3's band) when the baseline holds several seeds. Must not
read files or run anything: it judges RunRecords it is given. Every number it uses comes from the
protocol's [calibrated] section.

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

The curve check. Every curve (the seeds' and the run's) is put on the baseline's logged steps over the
common range (linear interpolation), smoothed with a centred moving average over smoothing_fraction
of the points (at least 3, shrinking at the ends), and cut into curve_segments equal blocks of
points; each block's mean is one quantity of the rule above (n = curve_segments). The per-step
envelope (the same rule applied step by step to the smoothed curves) is reported as evidence: where
the run first leaves it. A non-finite loss in the run fails the loss checks outright: NaN is not noise.

Margins. Each quantity has a margin (a fraction of the seeds' mean, protocol [calibrated] *_margin_rel):
the band is never narrower than it. A difference must be both beyond the seeds' noise and beyond what
the protocol calls near; with NCSU that is its own 5% / 1%, so the calibrated rule never flags what the
fixed rule, given a noise-free reference, would accept.

The gradient-norm curve. The probe records, at each optimizer step, the global norms of the gradient the
optimizer is handed (after any clipping done before it) and of the parameters. When the run and at
least two seeds carry them, the curve check judges the scale-free gradient norm ||g|| x ||theta|| too
(behind a normalisation layer the gradient scales as 1 / the weights' scale, so the product does not
move with the init distribution's scale), block by block with the same rule, never narrower than
grad_norm_margin_rel, after its first grad_norm_skip_fraction of steps (the init transient); the check's
alpha is split between the two curves (n = 2 x curve_segments). It sees the faults an adaptive
optimizer hides from the loss: Adam divides a constant gradient scale away, so gradients summed
instead of averaged, or clipped per shard, train almost the same loss curve.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np

from ladder.checks.compare import curve_arrays, window_mean
from ladder.runs.records import RunRecord

if TYPE_CHECKING:
    from ladder.migration.protocol import CalibratedRules, Protocol


# ------------------------------------------------------------------ Student's t, without scipy

def _betacf(a: float, b: float, x: float) -> float:
    # Lentz's continued fraction for the incomplete beta function (Numerical Recipes 6.4).
    tiny = 1e-300
    qab, qap, qam = a + b, a + 1.0, a - 1.0
    c, d = 1.0, 1.0 - qab * x / qap
    d = 1.0 / (d if abs(d) > tiny else tiny)
    h = d
    for m in range(1, 400):
        m2 = 2 * m
        for aa in (m * (b - m) * x / ((qam + m2) * (a + m2)), -(a + m) * (qab + m) * x / ((a + m2) * (qap + m2))):
            d = 1.0 + aa * d
            d = 1.0 / (d if abs(d) > tiny else tiny)
            c = 1.0 + aa / c
            c = c if abs(c) > tiny else tiny
            h *= d * c
        if abs(d * c - 1.0) < 1e-14:
            break
    return h


def _betai(a: float, b: float, x: float) -> float:
    if x <= 0.0:
        return 0.0
    if x >= 1.0:
        return 1.0
    lbt = math.lgamma(a + b) - math.lgamma(a) - math.lgamma(b) + a * math.log(x) + b * math.log1p(-x)
    if x < (a + 1.0) / (a + b + 2.0):
        return math.exp(lbt) * _betacf(a, b, x) / a
    return 1.0 - math.exp(lbt) * _betacf(b, a, 1.0 - x) / b


def t_cdf(t: float, df: float) -> float:
    tail = 0.5 * _betai(df / 2.0, 0.5, df / (df + t * t))
    return 1.0 - tail if t > 0 else tail


def t_quantile(q: float, df: float) -> float:
    """The q-quantile of Student's t with df degrees of freedom (bisection on the exact CDF)."""
    if not 0.0 < q < 1.0:
        raise ValueError(f"quantile {q} outside (0, 1)")
    if q < 0.5:
        return -t_quantile(1.0 - q, df)
    lo, hi = 0.0, 1.0
    while t_cdf(hi, df) < q:
        hi *= 2.0
    for _ in range(200):
        mid = 0.5 * (lo + hi)
        lo, hi = (mid, hi) if t_cdf(mid, df) < q else (lo, mid)
        if hi - lo < 1e-12 * max(1.0, hi):
            break
    return 0.5 * (lo + hi)


# ------------------------------------------------------------------ the rule on one quantity

@functools.lru_cache(maxsize=4096)
def _crit(k: int, alpha: float, n_tests: int) -> float:
    """Half-width of the prediction band in units of the (floored) sd, for k seeds."""
    return t_quantile(1.0 - alpha / (2.0 * n_tests), k - 1) * math.sqrt(1.0 + 1.0 / k)


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
    more_seeds: int = 0  # undecided: the fewest extra seeds that would decide

    def band(self) -> dict[str, Any]:
        return {"mean": self.mean, "lo": self.lo, "hi": self.hi, "sd": self.sd, "sd_used": self.sd_used,
                "seeds": self.seeds}


def decide(value: float, values: list[float], floor_rel: float, rules: "CalibratedRules",
           n_tests: int = 1, margin_rel: float = 0.0) -> Decision:
    """Judge one quantity against the seeds' values by the module's rule (needs >= 2 finite seeds).

    margin_rel: the smallest difference that counts (a fraction of the seeds' mean): the band is never
    narrower than it, so a difference the seeds can resolve but the protocol calls near is passed.
    """
    vals = np.array([v for v in values if math.isfinite(v)], dtype=float)
    k = len(vals)
    if k < 2:
        raise ValueError("the rule needs at least 2 finite seed values")
    m = float(vals.mean())
    sd = float(vals.std(ddof=1))
    sd_used = max(sd, floor_rel * abs(m))
    margin = margin_rel * abs(m)
    if sd_used == 0.0 and margin == 0.0:  # all seeds exactly 0, no floor, no margin: only an exact match
        ok = value == m
        return Decision(ok, value, m, sd, 0.0, m, m, k, 0.0 if ok else math.inf)
    half = max(_crit(k, rules.alpha, n_tests) * sd_used, margin)
    dist = abs(value - m)
    z = dist / half if math.isfinite(value) else math.inf
    if not math.isfinite(value) or dist > half:
        return Decision(False, value, m, sd, sd_used, m - half, m + half, k, z)
    more = 0
    if k < rules.max_seeds and dist > max(_crit(rules.max_seeds, rules.alpha, n_tests) * sd_used, margin):
        # Ask for max_seeds, not the fewest seeds that might decide: re-testing a borderline run at every
        # added seed is sequential testing, and inflates false alarms (measured: benchmarks/detection).
        more = rules.max_seeds - k
    return Decision(None if more else True, value, m, sd, sd_used, m - half, m + half, k, z, more)


# ------------------------------------------------------------------ verdicts

@dataclass(frozen=True)
class Verdict:
    """A calibrated verdict: passed True / False / None (undecided, `more_seeds` would decide)."""

    check: str
    passed: bool | None
    measured: Any
    band: dict[str, Any]
    seeds: int
    rule: str
    summary: str
    more_seeds: int = 0
    details: dict[str, Any] = field(default_factory=dict)

    @property
    def status(self) -> str:
        return "passed" if self.passed else "failed" if self.passed is not None else "undecided"

    def explain(self) -> str:
        tail = (f"undecided: {self.more_seeds} more baseline seed(s) would decide" if self.passed is None
                else "within noise" if self.passed else "different beyond noise")
        return f"calibrated {self.check} ({self.seeds} seeds; {self.rule}): {self.summary} -> {tail}"

    def as_dict(self) -> dict[str, Any]:
        return {"check": self.check, "passed": self.passed, "status": self.status, "measured": self.measured,
                "band": self.band, "seeds": self.seeds, "rule": self.rule, "summary": self.summary,
                "more_seeds": self.more_seeds, "details": self.details, "explain": self.explain()}


def _rule_text(rules: "CalibratedRules", floor_rel: float, n_tests: int = 1, margin_rel: float = 0.0) -> str:
    per = f"alpha {rules.alpha:g}" + (f"/{n_tests} per block" if n_tests > 1 else "")
    tail = f", never narrower than +-{margin_rel:.0%}" if margin_rel else ""
    return f"two-sided t prediction band, {per}, sd floor {floor_rel:.2%} of the mean{tail}"


def _too_few(check: str, k: int, rules: "CalibratedRules", why: str) -> Verdict:
    need = max(2, rules.min_seeds) - k
    return Verdict(check, None, None, {"seeds": k}, k, "needs seeds", why, more_seeds=max(need, 1))


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
    return Verdict(check, d.passed, d.value, d.band(), d.seeds, _rule_text(rules, floor_rel, margin_rel=margin_rel),
                   summary, d.more_seeds, details or {})


def calibrated_loss_window(run: RunRecord, seeds: list[RunRecord], protocol: "Protocol") -> Verdict:
    """The mean loss over the protocol's last window fraction of steps, against the seeds' spread."""
    rules, frac = protocol.calibrated, protocol.l1.window_fraction
    bad = _nonfinite(run)
    if bad:
        return Verdict("loss_window", False, None, {}, len(seeds), "non-finite loss",
                       f"the run logged a non-finite loss at step {bad[0]} ({len(bad)} such steps)")
    mine = window_mean(run.loss_curve, frac)
    if mine is None:
        return Verdict("loss_window", False, None, {}, len(seeds), "no loss", "the run logged no loss")
    values = [v for v in (window_mean(s.loss_curve, frac) for s in seeds if _finite_curve(s)) if v is not None]
    if len(values) < 2:
        return _too_few("loss_window", len(values), rules, "fewer than 2 seeds with a finite loss curve")
    d = decide(mine, values, rules.loss_floor_rel, rules, margin_rel=rules.loss_margin_rel)
    return _from_decision("loss_window", d, rules, rules.loss_floor_rel,
                          f"mean loss over the last {frac:.0%}", details={"seed_values": values},
                          margin_rel=rules.loss_margin_rel)


def calibrated_metric(run: RunRecord, seeds: list[RunRecord], protocol: "Protocol") -> Verdict:
    """The headline metric against the seeds' spread, two-sided; the report says better or worse."""
    rules = protocol.calibrated
    if run.metric is None or not math.isfinite(run.metric):
        return Verdict("metric", False, run.metric, {}, len(seeds), "no metric",
                       f"the run reported no finite {run.metric_name or 'metric'}")
    values = [s.metric for s in seeds if s.metric is not None and math.isfinite(s.metric)]
    if len(values) < 2:
        return _too_few("metric", len(values), rules, "fewer than 2 seeds with a finite metric")
    d = decide(run.metric, values, rules.metric_floor_rel, rules, margin_rel=rules.metric_margin_rel)
    return _from_decision("metric", d, rules, rules.metric_floor_rel, run.metric_name or "metric",
                          direction=run.metric_direction, details={"seed_values": values},
                          margin_rel=rules.metric_margin_rel)


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


def _on_grid(run: RunRecord, grid: np.ndarray, fraction: float) -> np.ndarray:
    steps, loss = curve_arrays(run.loss_curve)
    return smooth(np.interp(grid, steps, loss), fraction)


def grad_norm_series(run: RunRecord, scale_free: bool = False) -> tuple[np.ndarray, np.ndarray] | None:
    """The probe's gradient norms (step, norm), sorted by step; None when the probe recorded none.

    scale_free: the gradient norm times the parameter norm, ||g|| * ||theta||: None when the probe recorded
    no parameter norm. Behind a normalisation layer the gradient scales as 1 / the weights' scale, so
    this product does not move with the init distribution's scale, which ports change legitimately.
    """
    gn = (run.probe or {}).get("grad_norms") or {}
    pts = gn.get("values") or []
    if not pts or (scale_free and any(len(p) < 3 for p in pts)):
        return None
    steps = np.array([float(p[0]) for p in pts])
    vals = np.array([float(p[1]) for p in pts])  # "nan"/"inf" were stored as text: float() reads them
    if scale_free:
        vals = vals * np.array([float(p[2]) for p in pts])
    order = np.argsort(steps, kind="stable")
    return steps[order], vals[order]


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
                + ("" if self.complete else f"; the run covers only {self.coverage:.0%} of the seeds' steps"))

    def band(self) -> dict[str, Any]:
        return {"steps": self.grid.astype(int).tolist(), "mean": self.mean.tolist(),
                "lo": (self.mean - self.half).tolist(), "hi": (self.mean + self.half).tolist(),
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


def _judge_curve(mine_xy: tuple[np.ndarray, np.ndarray], seeds_xy: list[tuple[np.ndarray, np.ndarray]],
                 rules: "CalibratedRules", floor_rel: float, n_tests: int, margin_rel: float = 0.0,
                 skip_fraction: float = 0.0, require_complete: bool = True) -> _CurveJudgement | str:
    """Block-by-block verdict of one curve against the seeds' curves; a reason string when it cannot judge.
    skip_fraction: the first part of the seeds' steps is not judged (coverage is counted without it).
    require_complete: a curve that ends (or starts) more than one sampling gap from the seeds' fails."""
    nseg = rules.curve_segments
    base_grid = seeds_xy[0][0]
    start = base_grid[0] + skip_fraction * (base_grid[-1] - base_grid[0])
    lo = max([s[0][0] for s in seeds_xy] + [mine_xy[0][0], start])
    hi = min([s[0][-1] for s in seeds_xy] + [mine_xy[0][-1]])
    base_grid = base_grid[base_grid >= start]
    grid = base_grid[(base_grid >= lo) & (base_grid <= hi)]
    if len(grid) < nseg:
        return f"the run and the seeds share {len(grid)} logged steps, fewer than {nseg} blocks"
    coverage = float((hi - lo) / max(1e-12, base_grid[-1] - base_grid[0]))
    # a curve sampled every k steps may end up to k steps before another (a thinned gradient-norm series
    # ends at 996 where a seed has 1000): within one sampling gap of the seeds' ends it covers them
    gap = max(float(np.max(np.diff(x[-10:]))) if len(x) > 1 else 0.0 for x, _ in [mine_xy, *seeds_xy])
    complete = (base_grid[-1] - hi) <= gap and (lo - base_grid[0]) <= gap
    frac = rules.smoothing_fraction
    seed_curves = np.stack([smooth(np.interp(grid, x, y), frac) for x, y in seeds_xy])
    mine = smooth(np.interp(grid, *mine_xy), frac)
    blocks = np.array_split(np.arange(len(grid)), nseg)
    decisions = [decide(float(mine[b].mean()), [float(c[b].mean()) for c in seed_curves], floor_rel, rules,
                        n_tests=n_tests, margin_rel=margin_rel) for b in blocks]
    passed, more = _combine([(d.passed, d.more_seeds) for d in decisions])
    if require_complete and not complete and passed:
        passed = False  # a run that stops early has not reproduced the curve, however close its start
    k = len(seeds_xy)
    mean, sd = seed_curves.mean(axis=0), seed_curves.std(axis=0, ddof=1)
    half = np.maximum(_crit(k, rules.alpha, n_tests) * np.maximum(sd, floor_rel * np.abs(mean)),
                      margin_rel * np.abs(mean))
    return _CurveJudgement(passed, more, decisions, grid, blocks, mean, half, mine, coverage, k, complete)


def _scale_free(run: RunRecord, seeds: list[RunRecord]) -> bool:
    """Judge ||g|| x ||theta|| when the run and every seed with gradient norms also carry parameter norms."""
    return grad_norm_series(run, True) is not None and all(grad_norm_series(s, True) is not None
                                                           for s in seeds if grad_norm_series(s) is not None)


def _grad_norm_part(run: RunRecord, seeds: list[RunRecord], rules: "CalibratedRules",
                    n_tests: int, scale_free: bool) -> _CurveJudgement | str:
    mine = grad_norm_series(run, scale_free)
    theirs = [x for x in (grad_norm_series(s, scale_free) for s in seeds) if x is not None
              and np.isfinite(x[1]).all() and len(x[0]) >= rules.curve_segments]
    if len(theirs) < 2:
        return "not compared: fewer than 2 baseline seeds carry gradient norms (re-record the baseline)"
    if mine is None:
        return ("not compared: the run's probe recorded no gradient norm (no torch optimizer step or optax "
                "optimizer was seen)")
    bad = np.nonzero(~np.isfinite(mine[1]))[0]
    if len(bad):
        return f"non-finite gradient norm at step {int(mine[0][bad[0]])} ({len(bad)} such steps)"
    # The series may be thinned (the probe's budget) and end a few steps early: whether the run stopped
    # early is the loss curve's to judge.
    return _judge_curve(mine, theirs, rules, rules.curve_floor_rel, n_tests, margin_rel=rules.grad_norm_margin_rel,
                        skip_fraction=rules.grad_norm_skip_fraction, require_complete=False)


def calibrated_curve(run: RunRecord, seeds: list[RunRecord], protocol: "Protocol") -> Verdict:
    """The smoothed loss curve, block by block, against the seeds' per-block spread; and, when the run and
    the seeds carry the probe's gradient norms, the gradient-norm curve the same way (the check's alpha
    is then split between the two curves)."""
    rules = protocol.calibrated
    nseg = rules.curve_segments
    bad = _nonfinite(run)
    if bad:
        return Verdict("curve", False, None, {}, len(seeds), "non-finite loss",
                       f"the run logged a non-finite loss at step {bad[0]} ({len(bad)} such steps)")
    usable = [s for s in seeds if _finite_curve(s) and len(s.loss_curve) >= nseg]
    if len(usable) < 2:
        return _too_few("curve", len(usable), rules, "fewer than 2 seeds with a finite loss curve")
    if len(run.loss_curve) < nseg:
        return Verdict("curve", False, None, {}, len(usable), "too short",
                       f"the run logged {len(run.loss_curve)} loss points, fewer than {nseg} blocks")
    both = grad_norm_series(run) is not None and sum(grad_norm_series(s) is not None for s in usable) >= 2
    n_tests = nseg * (2 if both else 1)
    loss = _judge_curve(curve_arrays(run.loss_curve), [curve_arrays(s.loss_curve) for s in usable], rules,
                        rules.curve_floor_rel, n_tests, margin_rel=rules.curve_margin_rel)
    if isinstance(loss, str):
        return Verdict("curve", False, None, {}, len(usable), "no overlap", loss)
    scale_free = _scale_free(run, usable)
    gn = _grad_norm_part(run, usable, rules, n_tests, scale_free)
    parts = [(loss.passed, loss.more)] + ([(gn.passed, gn.more)] if isinstance(gn, _CurveJudgement) else
                                          [(False, 0)] if gn.startswith("non-finite") else [])
    passed, more = _combine(parts)
    label = "scale-free gradient-norm curve (||g|| x ||theta||)" if scale_free else "gradient-norm curve"
    summary = loss.summary("loss curve") + " || " + (gn.summary(label) if isinstance(gn, _CurveJudgement)
                                                    else f"gradient-norm curve: {gn}")
    measured = loss.measured()
    details: dict[str, Any] = {}
    if isinstance(gn, _CurveJudgement):
        measured["grad_norm"] = gn.measured()
        details["grad_norm"] = {"passed": gn.passed, "band": gn.band(), "what": label,
                                "margin_rel": rules.grad_norm_margin_rel, "skip_fraction": rules.grad_norm_skip_fraction,
                                "source": ((run.probe or {}).get("grad_norms") or {}).get("source")}
    else:
        details["grad_norm"] = {"passed": False if gn.startswith("non-finite") else None, "why": gn}
    rule = (_rule_text(rules, rules.curve_floor_rel, n_tests, rules.curve_margin_rel) + f", {nseg} blocks per "
            f"curve after a {rules.smoothing_fraction:.0%} moving average"
            + (f"; gradient norms: never narrower than +-{rules.grad_norm_margin_rel:.0%}, the first "
               f"{rules.grad_norm_skip_fraction:.0%} of steps not judged" if isinstance(gn, _CurveJudgement) else ""))
    return Verdict("curve", passed, measured, loss.band(), len(usable), rule, summary, more, details)
