"""Streaming parser for a run's output: loss curve, evaluations, headline metric, error lines.

It sees one decoded line at a time and keeps bounded state, so a multi-GB log costs no more memory
than a short one: long curves are decimated (every other point dropped, stride doubled) past a cap.
"""

from __future__ import annotations

import math
import re
from collections import deque

from ladder.runs.records import EvalPoint, LossPoint
from ladder.migration.spec import ParseSpec

MAX_CURVE_POINTS = 100_000
MAX_EVALS = 10_000
KEEP_LINES = 20
MAX_LINE_CHARS = 2_000  # stored excerpt lines are cut to this


def _num(text: str) -> float | None:
    try:
        return float(text)
    except ValueError:
        return None


class OutputParser:
    def __init__(self, spec: ParseSpec) -> None:
        self.loss_rx = re.compile(spec.loss)
        self.metric_rx = re.compile(spec.metric)
        self.eval_rx = re.compile(spec.eval) if spec.eval else None
        self.error_rx = re.compile(spec.error)
        self.curve: list[LossPoint] = []
        self.stride = 1
        self._since_kept = 0
        self.loss_lines = 0
        self.nonfinite: list[LossPoint] = []
        self.evals: list[EvalPoint] = []
        self.metric: float | None = None
        self.metric_raw: str | None = None
        self.first_lines: list[str] = []
        self.last_lines: deque[str] = deque(maxlen=KEEP_LINES)
        self.error_lines: list[str] = []
        self.line_count = 0
        self.last_step: int | None = None
        self.last_loss: float | None = None

    def feed(self, line: str, t: float) -> None:
        self.line_count += 1
        short = line[:MAX_LINE_CHARS]
        if len(self.first_lines) < KEEP_LINES:
            self.first_lines.append(short)
        self.last_lines.append(short)
        m = self.loss_rx.search(line)
        if m:
            self._loss(m, t)
        m = self.metric_rx.search(line)
        if m:
            self.metric_raw = m.group("value")
            self.metric = _num(self.metric_raw)
        if self.eval_rx is not None:
            m = self.eval_rx.search(line)
            if m and len(self.evals) < MAX_EVALS:
                self._eval(m, t)
        if len(self.error_lines) < KEEP_LINES and self.error_rx.search(line):
            self.error_lines.append(short)

    def _loss(self, m: re.Match[str], t: float) -> None:
        step, loss = _num(m.group("step")), _num(m.group("loss"))
        if step is None or loss is None:
            return
        self.loss_lines += 1
        point = LossPoint(step=int(step), loss=loss, t=round(t, 4))
        self.last_step, self.last_loss = point.step, loss
        if not math.isfinite(loss):
            if len(self.nonfinite) < KEEP_LINES:
                self.nonfinite.append(point)
            return
        self._since_kept += 1
        if self._since_kept < self.stride:
            return
        self._since_kept = 0
        self.curve.append(point)
        if len(self.curve) >= MAX_CURVE_POINTS:
            self.curve = self.curve[::2]
            self.stride *= 2

    def _eval(self, m: re.Match[str], t: float) -> None:
        groups = m.groupdict()
        step = _num(groups.pop("step", "") or "")
        items = _num(groups.pop("items", "") or "")
        values = {k: v for k, raw in groups.items() if raw is not None and (v := _num(raw)) is not None}
        self.evals.append(EvalPoint(t=round(t, 4), step=None if step is None else int(step),
                                    items=None if items is None else int(items), values=values))
