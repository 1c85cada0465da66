"""The report's figures, drawn with matplotlib's Agg backend and returned as PNG bytes.

Pure drawing: the data comes in as run records and numbers; nothing here reads the journal.
"""

from __future__ import annotations

import io
from typing import Callable

import matplotlib

matplotlib.use("Agg")  # no display: the report is rendered headless, in CI too

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from ladder.checks.compare import curve_arrays  # noqa: E402
from ladder.runs.records import RunRecord  # noqa: E402

Series = Callable[[RunRecord], "tuple[np.ndarray, np.ndarray] | None"]


def loss_series(r: RunRecord) -> tuple[np.ndarray, np.ndarray] | None:
    return curve_arrays(r.loss_curve) if r.loss_curve else None

BASELINE_COLOR = "#444444"
PALETTE = ["#1f77b4", "#d62728", "#2ca02c", "#9467bd", "#ff7f0e", "#17becf", "#8c564b", "#e377c2", "#bcbd22"]


def attempt_color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=110, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _finite(steps: np.ndarray, loss: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    ok = np.isfinite(loss)
    return steps[ok], loss[ok]


def seed_band(runs: list[RunRecord], series: Series = loss_series
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None:
    """Steps, min, mean, max of the seeds' curves (losses by default) over the steps they all cover
    (None for < 2 seeds)."""
    curves = [_finite(*xy) for xy in map(series, runs) if xy is not None]
    curves = [c for c in curves if len(c[0]) >= 2]
    if len(curves) < 2:
        return None
    lo, hi = max(c[0][0] for c in curves), min(c[0][-1] for c in curves)
    grid = np.unique(np.concatenate([c[0][(c[0] >= lo) & (c[0] <= hi)] for c in curves]))
    if len(grid) < 2:
        return None
    stack = np.vstack([np.interp(grid, s, v) for s, v in curves])
    return grid, stack.min(axis=0), stack.mean(axis=0), stack.max(axis=0)


def loss_curves_png(baseline: list[RunRecord], attempts: list[tuple[str, int, list[RunRecord]]],
                    title: str, series: Series = loss_series, ylabel: str = "loss") -> bytes:
    """Every attempt's runs over the baseline; the baseline's seed band is shaded when it has several seeds.

    attempts: (label, colour index, runs) per attempt. `series` picks the curve (the loss by default).
    """
    fig, ax = plt.subplots(figsize=(10, 4.6))
    band = seed_band(baseline, series)
    if band is not None:
        steps, lo, mean, hi = band
        ax.fill_between(steps, lo, hi, color=BASELINE_COLOR, alpha=0.22, lw=0,
                        label=f"baseline seed band ({len(baseline)} seeds, min-max)")
        ax.plot(steps, mean, color=BASELINE_COLOR, lw=2.2, label="baseline mean")
    else:
        for r in baseline:
            if (xy := series(r)) is not None:
                ax.plot(*_finite(*xy), color=BASELINE_COLOR, lw=2.2, label=f"baseline (seed {r.seed})")
    for label, ci, runs in attempts:
        for k, r in enumerate(runs):
            if (xy := series(r)) is None:
                continue
            s, v = _finite(*xy)
            if len(s):
                ax.plot(s, v, color=attempt_color(ci), lw=1.3, alpha=0.9, label=label if k == 0 else None)
    ax.set_xlabel("step")
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, ncol=2, loc="upper right")
    return _png(fig)


def metric_png(metric_name: str, baseline_metrics: list[float],
               attempts: list[tuple[int, int, list[float]]], direction: str) -> bytes:
    """Metric per attempt (one dot per run) against the baseline's band (min-max of its seeds).

    attempts: (attempt number, colour index, metrics of its runs).
    """
    fig, ax = plt.subplots(figsize=(10, 3.6))
    if baseline_metrics:
        lo, hi, mean = min(baseline_metrics), max(baseline_metrics), float(np.mean(baseline_metrics))
        if hi > lo:
            ax.axhspan(lo, hi, color=BASELINE_COLOR, alpha=0.2, lw=0,
                       label=f"baseline band ({len(baseline_metrics)} seeds)")
        ax.axhline(mean, color=BASELINE_COLOR, lw=1.8, ls="--", label=f"baseline {mean:.4g}")
    xs = []
    for number, ci, values in attempts:
        for v in values:
            ax.scatter([number], [v], color=attempt_color(ci), s=46, zorder=3)
            ax.annotate(f"{v:.4g}", (number, v), textcoords="offset points", xytext=(6, 4), fontsize=8)
        xs.append(number)
    if xs:
        ax.set_xticks(sorted(set(xs)))
    ax.set_xlabel("attempt")
    ax.set_ylabel(f"{metric_name} ({'higher' if direction == 'max' else 'lower'} is better)")
    ax.set_title(f"{metric_name} per attempt")
    ax.grid(alpha=0.3)
    ax.legend(fontsize=8, loc="best")
    return _png(fig)
