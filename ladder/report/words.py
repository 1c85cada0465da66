"""A journaled check result in plain words: its measured-against-threshold cell, the one-line headline
of its evidence, and an attempt's first failed check. Shared by the HTML report and its markdown twin.

Must not: judge anything; every number comes from the journaled result (ladder.report.judged).
"""

from __future__ import annotations

import math
from typing import Any

from ladder.checks.results import CLIMBS, level_index
from ladder.journal.audit import AttemptView
from ladder.report.judged import Check, ValueBand, calibrated, curve_band, curve_measured, value_band

HEADLINE_CHARS = 240
QUANTITY = {"loss_window": "the mean loss over the last window", "metric": "the metric", "curve": "the loss curve"}


def num(x: Any) -> str:
    if isinstance(x, bool) or not isinstance(x, (int, float)):
        return "—" if x is None else str(x)
    return f"{x:.4g}" if math.isfinite(x) else str(x)


def _decimals(lo: float, hi: float) -> int:
    """Enough decimals to tell the band's ends apart, and no more."""
    width = abs(hi - lo)
    return 3 if width == 0 else min(6, max(0, 1 - math.floor(math.log10(width))))


def band_text(value: float, lo: float, hi: float, seeds: int | None, tol: float | None = None) -> str:
    """ "0.303 vs band 0.205-0.260 (5 seeds)"; a fixed rule's band says its tolerance instead of seeds."""
    k = _decimals(lo, hi)
    source = f"{seeds} seeds" if seeds is not None else f"baseline +-{tol:.0%}" if tol is not None else ""
    return f"{value:.{k}f} vs band {lo:.{k}f}-{hi:.{k}f}" + (f" ({source})" if source else "")


def _value_cell(b: ValueBand) -> str:
    return band_text(b.value, b.lo, b.hi, b.seeds, b.tol)


def _block_steps(band: dict[str, Any], block: int) -> str:
    """The steps of block #block (1-based): the check cut its steps into equal blocks of points."""
    steps, n = band["steps"], len(band.get("blocks") or []) or 1
    size, extra = divmod(len(steps), n)
    start = (block - 1) * size + min(block - 1, extra)
    end = start + size + (1 if block - 1 < extra else 0) - 1
    return f"steps {steps[start]}-{steps[end]}"


def _curve_cell(check: Check, part: str) -> str | None:
    band, m = curve_band(check, part), curve_measured(check, part)
    worst = m.get("worst_block")
    if band is None or not isinstance(worst, int) or worst > len(band.get("blocks") or []):
        return None
    b = band["blocks"][worst - 1]
    where = ("leaves the band at step " + str(m["first_step_outside"]) if m.get("first_step_outside") is not None
             else "inside the band at every step")
    return (f"worst block #{worst} ({_block_steps(band, worst)}): "
            f"{band_text(b['value'], b['lo'], b['hi'], b.get('seeds'))}; {where}")


def _plain(x: Any) -> str:
    if isinstance(x, dict):
        return ", ".join(f"{str(k).replace('_', ' ')} {_plain(v)}" for k, v in x.items()) or "none"
    if isinstance(x, (list, tuple)):
        return ", ".join(_plain(v) for v in x) or "none"
    return num(x)


def measured_text(check: Check) -> str:
    """The measured-against-threshold cell of one check."""
    b = value_band(check)
    if b is not None:
        return _value_cell(b)
    parts = [c for c in (_curve_cell(check, "loss"), _curve_cell(check, "grad_norm")) if c]
    if parts:
        return parts[0] + ("" if len(parts) == 1 else f" | gradient norm: {parts[1]}")
    cal = calibrated(check)
    if cal is not None:
        return f"{_plain(check.get('measured'))}; no band: {cal.get('rule') or cal.get('status')}"
    m, t = check.get("measured"), check.get("threshold")
    if m is None and t is None:
        return "not measured"
    return _plain(m) if t is None else f"{_plain(m)} (threshold {_plain(t)})"


def _calibrated_headline(cal: dict[str, Any], check: Check) -> str:
    what = QUANTITY.get(cal.get("check", ""), cal.get("check", "the quantity"))
    status = check.get("status")
    if status == "not_checked":
        return f"{what} was not compared: {cal.get('blocked') or cal.get('summary')}"
    if status == "undecided":
        why = "" if curve_band(check) or value_band(check) else f" ({cal.get('summary')})"
        return f"{what} is not decided yet: {cal.get('more_seeds')} more baseline seed(s) would decide{why}"
    verdict = "within the baseline seeds' noise" if status == "passed" else \
        "different from the baseline beyond the seeds' noise"
    if value_band(check) is None and curve_band(check) is None:
        return f"{what} is {verdict}: {cal.get('summary')}"
    first = curve_measured(check).get("first_step_outside")
    where = "" if curve_band(check) is None else (
        f"; the smoothed curve leaves the band at step {first}" if first is not None
        else "; the smoothed curve stays inside the band")
    return f"{what} is {verdict}{where}"


def headline(check: Check) -> str:
    """The evidence's first sentence in plain words; the rest (statistics, the other rule) is detail."""
    cal = calibrated(check)
    text = _calibrated_headline(cal, check) if cal is not None else str(check.get("evidence") or "").split(" | ")[0]
    return text if len(text) <= HEADLINE_CHARS else text[:HEADLINE_CHARS] + "…"


def detail(check: Check) -> str:
    """What the headline leaves out: the full evidence and, for a calibrated check, its rule."""
    cal = calibrated(check)
    evidence = str(check.get("evidence") or "")
    rule = f"rule: {cal.get('rule')}" if cal is not None and cal.get("rule") else ""
    if cal is None and evidence == headline(check):
        return ""
    return "\n".join(p for p in (evidence.replace(" | ", "\n"), rule) if p)


def check_title(check: Check) -> str:
    return f"{check.get('level')} {str(check.get('name', '')).replace('_', ' ')}"


def first_failed(a: AttemptView) -> str:
    """The attempt's first failed check (lowest level, short run first), in plain words; without one, the
    first check that stopped the climb (undecided, not checked); else that none did."""
    if not a.checks:
        return "no run was checked"
    found = [(c.get("status") != "failed", level_index(c.get("level")), n, e.kind, c)
             for n, e in enumerate(sorted(a.checks, key=lambda e: e.kind != "short"))
             for c in e.checks if c.get("status") not in CLIMBS]
    if not found:
        return "none: every check passed"
    *_, kind, c = min(found, key=lambda f: f[:3])
    status = "" if c.get("status") == "failed" else f" ({str(c.get('status')).replace('_', ' ')})"
    return f"{check_title(c)}{status}, {kind} run: {headline(c)}"
