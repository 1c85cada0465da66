"""Pure comparisons of loss curves and metrics: the measurements behind L1 (and the stop rules).

The trend test. Each curve is cut into `segments` equal windows of steps over the range both curves
cover; each window's mean loss is taken; consecutive window means give moves, expressed as a
fraction of the baseline's first-window mean. A move is "down" below -flat_tol, "up" above +flat_tol,
otherwise "flat". Trends agree when every window-to-window move has the same class in both curves,
where a "flat" move also matches a move of magnitude below near_flat x flat_tol (a plateau that is
still creeping down must not count as a disagreement). The classes and moves are the evidence.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from ladder.runs.records import LossPoint


def curve_arrays(curve: list[LossPoint]) -> tuple[np.ndarray, np.ndarray]:
    steps = np.array([p.step for p in curve], dtype=float)
    loss = np.array([p.loss for p in curve], dtype=float)
    order = np.argsort(steps, kind="stable")
    return steps[order], loss[order]


def window_mean(curve: list[LossPoint], fraction: float) -> float | None:
    """Mean loss over the last `fraction` of the logged steps (by step number)."""
    steps, loss = curve_arrays(curve)
    if len(steps) == 0:
        return None
    lo, hi = steps[0], steps[-1]
    cut = hi - fraction * (hi - lo)
    sel = loss[steps >= cut]
    return float(sel.mean()) if len(sel) else None


def rel_diff(value: float, reference: float) -> float:
    if reference == 0:
        return 0.0 if value == 0 else math.inf
    return abs(value - reference) / abs(reference)


@dataclass(frozen=True)
class Pairing:
    """How closely a run's loss curve follows another run's at their common logged steps (relative)."""

    steps: int
    first: float  # at the first common step
    drift: float  # the largest over all common steps
    at: int  # the step of the largest


def pairing(curve: list[LossPoint], other: list[LossPoint]) -> Pairing | None:
    """None when the curves share fewer than 3 finite logged steps."""
    a = {p.step: p.loss for p in curve if math.isfinite(p.loss)}
    b = {p.step: p.loss for p in other if math.isfinite(p.loss)}
    common = sorted(set(a) & set(b))
    if len(common) < 3:
        return None
    rel = [rel_diff(a[s], b[s]) for s in common]
    i = max(range(len(rel)), key=rel.__getitem__)
    return Pairing(len(common), rel[0], rel[i], common[i])


@dataclass(frozen=True)
class TrendResult:
    agree: bool
    run_classes: list[str]
    base_classes: list[str]
    run_moves: list[float]
    base_moves: list[float]
    segments: int

    def describe(self) -> str:
        return (f"window-to-window moves (fraction of the baseline's first window): run "
                f"{[round(m, 4) for m in self.run_moves]} {self.run_classes}, baseline "
                f"{[round(m, 4) for m in self.base_moves]} {self.base_classes}")


def segment_means(steps: np.ndarray, loss: np.ndarray, lo: float, hi: float, segments: int) -> list[float]:
    edges = np.linspace(lo, hi, segments + 1)
    means = []
    for i in range(segments):
        last = i == segments - 1
        sel = (steps >= edges[i]) & ((steps <= edges[i + 1]) if last else (steps < edges[i + 1]))
        means.append(float(loss[sel].mean()) if sel.any() else math.nan)
    return means


def _classify(move: float, flat_tol: float) -> str:
    return "down" if move < -flat_tol else "up" if move > flat_tol else "flat"


def trend_test(run: list[LossPoint], base: list[LossPoint], segments: int, flat_tol: float,
               near_flat: float) -> TrendResult | None:
    """None when the curves do not share enough steps to compare."""
    rs, rl = curve_arrays(run)
    bs, bl = curve_arrays(base)
    if len(rs) < segments or len(bs) < segments:
        return None
    lo, hi = max(rs[0], bs[0]), min(rs[-1], bs[-1])
    if hi <= lo:
        return None
    rm, bm = segment_means(rs, rl, lo, hi, segments), segment_means(bs, bl, lo, hi, segments)
    if any(math.isnan(x) for x in rm + bm) or bm[0] == 0:
        return None
    scale = abs(bm[0])
    run_moves = [(rm[i + 1] - rm[i]) / scale for i in range(segments - 1)]
    base_moves = [(bm[i + 1] - bm[i]) / scale for i in range(segments - 1)]
    rc = [_classify(m, flat_tol) for m in run_moves]
    bc = [_classify(m, flat_tol) for m in base_moves]
    agree = True
    for r_cls, b_cls, r_mv, b_mv in zip(rc, bc, run_moves, base_moves):
        if r_cls == b_cls:
            continue
        if r_cls == "flat" and abs(b_mv) < near_flat * flat_tol:
            continue
        if b_cls == "flat" and abs(r_mv) < near_flat * flat_tol:
            continue
        agree = False
    return TrendResult(agree, rc, bc, run_moves, base_moves, segments)
