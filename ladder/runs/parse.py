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
    except (TypeError, ValueError):
        return None


def _count(text: str | None) -> int | None:
    """A step, batch or item count: a finite whole number; anything else (nan, inf, 1.5, junk) is None."""
    v = _num(text or "")
    if v is None or not math.isfinite(v) or v != int(v) or abs(v) > 2**62:
        return None
    return int(v)


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
        self.repeated_steps = 0  # loss lines whose step is not after the previous line's
        self.unreadable = 0  # loss lines whose step or loss is not a number
        self.first_repeat: int | None = None
        self._by_epoch = "step" not in self.loss_rx.groupindex
        self._epochs: dict[int, int] = {}  # epoch -> steps before it (epoch/batch logs)
        self._epoch_max: dict[int, int] = {}
        self._zero_based: bool | None = None

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

    def _step_of(self, m: re.Match[str]) -> int | None:
        """The global step: the `step` group, or epoch and batch (batches per epoch from the line, else from
        the largest batch index the previous epochs printed)."""
        if not self._by_epoch:
            return _count(m.group("step"))
        epoch, batch = _count(m.group("epoch")), _count(m.group("batch"))
        if epoch is None or batch is None:
            return None
        if self._zero_based is None:
            self._zero_based = batch == 0
        batches = _count(m.groupdict().get("batches"))
        if epoch not in self._epochs:
            earlier = [e for e in self._epochs if e < epoch]
            if earlier:
                prev = max(earlier)
                per = int(batches) if batches else self._epoch_max.get(prev, 0) + (1 if self._zero_based else 0)
                self._epochs[epoch] = self._epochs[prev] + per * (epoch - prev)
            else:
                self._epochs[epoch] = 0
        self._epoch_max[epoch] = max(self._epoch_max.get(epoch, 0), batch)
        return self._epochs[epoch] + batch + (1 if self._zero_based else 0)

    def _loss(self, m: re.Match[str], t: float) -> None:
        step, loss = self._step_of(m), _num(m.group("loss"))
        if step is None or loss is None:
            self.unreadable += 1
            return
        self.loss_lines += 1
        if self.last_step is not None and step <= self.last_step:
            self.repeated_steps += 1
            if self.first_repeat is None:
                self.first_repeat = step
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
        step = _count(groups.pop("step", None))
        items = _count(groups.pop("items", None))
        values = {k: v for k, raw in groups.items() if raw is not None and (v := _num(raw)) is not None}
        self.evals.append(EvalPoint(t=round(t, 4), step=step, items=items, values=values))
