"""The report's figures, drawn with matplotlib's Agg backend and returned as PNG bytes.

Pure drawing: the data comes in as panels and points (ladder.report.figures builds them from what the
checks judged); nothing here reads the journal. Attempts are kept apart by colour and by dash or marker,
so that the figures survive a grey-scale print; the baseline's band is always grey.
"""

from __future__ import annotations

import io
import math
from dataclasses import dataclass, field
from typing import Any

import matplotlib

matplotlib.use("Agg")  # no display: the report is rendered headless, in CI too

import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

BAND_COLOR = "#8c8c8c"
PALETTE = ["#0072b2", "#d55e00", "#009e73", "#cc79a7", "#e69f00", "#56b4e9", "#7f3c8d", "#3b3b98", "#a0522d"]
DASHES: list[Any] = ["-", (0, (6, 2)), (0, (1.5, 1.5)), (0, (7, 2, 1.5, 2)), (0, (3, 1, 1, 1, 1, 1)), (0, (10, 3))]
MARKERS = ["o", "s", "^", "D", "v", "P", "X", "*", "h"]
STATUS_COLOR = {"passed": "#17773a", "failed": "#b3261e", "undecided": "#6a3fb5"}
XY = tuple[np.ndarray, np.ndarray]


def attempt_color(i: int) -> str:
    return PALETTE[i % len(PALETTE)]


def attempt_dash(i: int) -> Any:
    return DASHES[i % len(DASHES)]


def attempt_marker(i: int) -> str:
    return MARKERS[i % len(MARKERS)]


@dataclass
class CurvePanel:
    """One run's judged curve. band: the check's per-step band (steps, mean, lo, hi, run: the run's smoothed
    curve); without one, the raw curves are drawn: the run's and the baseline's it was compared with. A band
    journaled without the smoothed curve (older journals) is drawn with the run's curve as logged."""

    title: str
    index: int  # the attempt's position: its colour and dash
    status: str
    band: dict[str, Any] | None = None
    first_out: int | None = None
    run: XY | None = None
    baseline: list[XY] = field(default_factory=list)

    @property
    def drawable(self) -> bool:
        return self.band is not None or self.run is not None


@dataclass(frozen=True)
class ValuePoint:
    """One run's judged number and the interval it had to fall in (None: no band was drawn)."""

    label: str
    index: int
    status: str
    value: float
    lo: float | None = None
    hi: float | None = None
    centre: float | None = None


def _png(fig: plt.Figure) -> bytes:
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _grid(n: int, height: float) -> tuple[plt.Figure, list[plt.Axes]]:
    cols = 1 if n == 1 else 2
    rows = math.ceil(n / cols)
    fig, axes = plt.subplots(rows, cols, figsize=(11, height * rows + 0.4), squeeze=False, sharex=True,
                             layout="constrained")  # keeps the suptitle clear of a single panel's title
    flat = list(axes.flat)
    for ax in flat[n:]:
        ax.set_visible(False)
    return fig, flat[:n]


def _draw_band(ax: plt.Axes, p: CurvePanel) -> None:
    b = p.band or {}
    steps = np.asarray(b["steps"], dtype=float)
    ax.fill_between(steps, b["lo"], b["hi"], color=BAND_COLOR, alpha=0.3, lw=0, label="baseline band")
    ax.plot(steps, b["mean"], color=BAND_COLOR, lw=1.6, ls=(0, (4, 2)), label="baseline seeds' mean")
    style = {"color": attempt_color(p.index), "ls": attempt_dash(p.index), "lw": 2.0}
    if "run" in b:
        ax.plot(steps, b["run"], label="run, smoothed", **style)
    elif p.run is not None:  # a journal written before checks kept the smoothed curve
        ax.plot(*p.run, label="run, as logged", **style)
    if p.first_out is not None:
        ax.axvline(p.first_out, color=STATUS_COLOR["failed"], lw=1, ls=":", label=f"leaves the band at {p.first_out}")


def _draw_raw(ax: plt.Axes, p: CurvePanel) -> None:
    for k, (s, v) in enumerate(p.baseline):
        ax.plot(s, v, color=BAND_COLOR, lw=1.2, label="baseline seed(s)" if k == 0 else None)
    if p.run is not None:
        ax.plot(*p.run, color=attempt_color(p.index), ls=attempt_dash(p.index), lw=1.6, label="run (no band)")


def curve_panels_png(panels: list[CurvePanel], title: str, ylabel: str) -> bytes:
    """One panel per judged run: its curve against the band the check drew (or the raw curves without one)."""
    fig, axes = _grid(len(panels), 3.0)
    for ax, p in zip(axes, panels):
        (_draw_band if p.band is not None else _draw_raw)(ax, p)
        ax.set_title(p.title, fontsize=10, color=STATUS_COLOR.get(p.status, "#555555"))
        ax.set_ylabel(ylabel, fontsize=9)
        ax.grid(alpha=0.3)
        ax.legend(fontsize=7, loc="upper right")
    for ax in axes[-2:]:
        ax.set_xlabel("step")
    fig.suptitle(title, fontsize=12)
    return _png(fig)


def _draw_point(ax: plt.Axes, x: int, p: ValuePoint) -> None:
    if p.lo is not None and p.hi is not None:
        ax.plot([x, x], [p.lo, p.hi], color=BAND_COLOR, lw=9, alpha=0.45, solid_capstyle="butt",
                label="band" if x == 0 else None)
    if p.centre is not None:
        ax.plot([x - 0.22, x + 0.22], [p.centre] * 2, color=BAND_COLOR, lw=1.6, label="baseline" if x == 0 else None)
    ax.scatter([x], [p.value], color=attempt_color(p.index), marker=attempt_marker(p.index), s=60, zorder=3,
               edgecolors=STATUS_COLOR.get(p.status, "#555555"), linewidths=1.5)
    ax.annotate(f"{p.value:.4g}", (x, p.value), textcoords="offset points", xytext=(9, -3), fontsize=8)


def values_png(groups: list[tuple[str, list[ValuePoint]]]) -> bytes:
    """Dot-and-interval plot: per check (one panel), every run's value against its band."""
    fig, axes = plt.subplots(1, len(groups), figsize=(11, 3.8), squeeze=False)
    for ax, (name, points) in zip(axes[0], groups):
        for x, p in enumerate(points):
            _draw_point(ax, x, p)
        ax.set_xticks(range(len(points)))
        ax.set_xticklabels([f"{p.label}\n{p.status.replace('_', ' ')}" for p in points], fontsize=8)
        ax.set_xlim(-0.6, len(points) - 0.4)
        ax.set_title(name, fontsize=10)
        ax.grid(alpha=0.3, axis="y")
        ax.legend(fontsize=7, loc="best")
    return _png(fig)
