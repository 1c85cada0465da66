"""The report's figures, built from what the L1 checks judged: each run's smoothed loss curve and gradient-norm
curve against the band the curve check drew, and the loss-window and metric values against their bands.

A check that drew no band (the fixed rule, too few seeds) is shown with the raw curves it compared, and says
so. Must not: recompute a band; the bands come from the journal (ladder.report.judged).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np

from ladder.checks.compare import curve_arrays
from ladder.checks.stats import grad_norm_series
from ladder.report.build import ReportData
from ladder.report.judged import Judged, calibrated, curve_band, curve_measured, judged, value_band
from ladder.report.plots import XY, CurvePanel, ValuePoint, curve_panels_png, values_png
from ladder.runs.records import RunRecord

GRAD_NORM_STATUS = {True: "passed", False: "failed", None: "undecided"}


@dataclass(frozen=True)
class Figure:
    title: str
    png: bytes
    shows: list[str]  # the judged runs it draws, "attempt N kind" each: the caption, and what tests look for


def _loss(r: RunRecord) -> XY | None:
    return curve_arrays(r.loss_curve) if r.loss_curve else None


def _grad_norm(r: RunRecord) -> XY | None:
    s = grad_norm_series(r, True) or grad_norm_series(r)  # the scale-free norm when recorded: what is judged
    return None if s is None else (s[0], s[1])


def _finite(xy: XY | None) -> XY | None:
    if xy is None:
        return None
    ok = np.isfinite(xy[1])
    return (xy[0][ok], xy[1][ok]) if ok.sum() >= 2 else None


def _panel(d: ReportData, j: Judged, part: str, series: Callable[[RunRecord], XY | None]) -> CurvePanel:
    band = curve_band(j.check, part)
    if part == "loss":
        status = str(j.check.get("status"))
    else:
        status = GRAD_NORM_STATUS.get(((calibrated(j.check) or {}).get("details") or {}).get("grad_norm", {})
                                      .get("passed"), "undecided")
    title = f"attempt {j.attempt}, {j.kind} run: {status.replace('_', ' ')}" + ("" if band else " (no band drawn)")
    run = d.runs.get(j.run_dir)
    mine = _finite(series(run)) if run else None
    if band is not None:
        return CurvePanel(title, j.index, status, band, curve_measured(j.check, part).get("first_step_outside"),
                          run=mine)
    seeds = d.baseline_short if j.kind == "short" else d.baseline_full
    return CurvePanel(title, j.index, status, run=mine,
                      baseline=[xy for xy in (_finite(series(s)) for s in seeds) if xy is not None])


def _curve_figures(d: ReportData) -> list[Figure]:
    out = []
    trend = judged(d.history, "trend")
    for part, series, name, ylabel in (("loss", _loss, "loss curve", "loss"),
                                       ("grad_norm", _grad_norm, "gradient norm", "||g|| x ||theta||")):
        for kind in ("short", "full"):
            runs = [j for j in trend if j.kind == kind]
            panels = [(j, _panel(d, j, part, series)) for j in runs]
            panels = [(j, p) for j, p in panels if p.drawable]
            if not panels:
                continue
            title = f"{name}, {kind} runs"
            png = curve_panels_png([p for _, p in panels], f"L1 curve check, {title}: each run against the "
                                   "baseline seeds' band (grey)", ylabel)
            out.append(Figure(title, png, [f"attempt {j.attempt} {j.kind}" for j, _ in panels]))
    return out


def _value_points(d: ReportData, name: str) -> list[ValuePoint]:
    points = []
    for j in judged(d.history, name):
        b = value_band(j.check)
        if b is not None:
            points.append(ValuePoint(f"attempt {j.attempt}\n{j.kind}", j.index, str(j.check.get("status")),
                                     b.value, b.lo, b.hi, b.centre))
    return points


def _value_figure(d: ReportData) -> list[Figure]:
    groups = [(title, _value_points(d, name)) for name, title in
              (("loss_window", "L1 loss window: mean loss of the last steps"),
               ("metric", f"L1 metric: {d.metric_name}"))]
    groups = [g for g in groups if g[1]]
    if not groups:
        return []
    shows = sorted({p.label.replace("\n", " ") for _, pts in groups for p in pts})
    return [Figure("loss window and metric against their bands", values_png(groups), shows)]


def figures(d: ReportData) -> list[Figure]:
    return _curve_figures(d) + _value_figure(d)
