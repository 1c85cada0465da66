"""What each L1 check judged, read back from the journaled check results: the value and its band.

The report's cells and figures are drawn from these, so that they show exactly what the verdict was
computed from. Must not: recompute a band or re-judge a run (the journal holds the verdict).

A calibrated check carries details["calibrated"] (ladder.checks.stats.Verdict.as_dict): its band is
{mean, lo, hi, seeds} for a scalar, and {steps, mean, lo, hi, run, blocks} for a curve. A fixed-rule
check carries details["fixed_rule"] {run, baseline, tol}: its band is the baseline +- tol.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from ladder.journal.audit import History

Check = dict[str, Any]  # one journaled CheckResult.model_dump()


@dataclass(frozen=True)
class ValueBand:
    """One judged number against the interval it had to fall in."""

    value: float
    lo: float
    hi: float
    centre: float
    seeds: int | None  # calibrated: the baseline seeds behind the band
    tol: float | None = None  # fixed rule: the relative tolerance around the baseline


@dataclass(frozen=True)
class Judged:
    """One run's judged quantity, placed in its attempt (number, and position for its colour)."""

    attempt: int
    index: int
    kind: str
    run_dir: str
    check: Check


def calibrated(check: Check) -> dict[str, Any] | None:
    cal = (check.get("details") or {}).get("calibrated")
    return cal if isinstance(cal, dict) else None


def _finite(*xs: Any) -> bool:
    return all(isinstance(x, (int, float)) and math.isfinite(x) for x in xs)


def value_band(check: Check) -> ValueBand | None:
    """A scalar check's value and band: the calibrated band, else the fixed rule's; None when none was drawn."""
    cal = calibrated(check)
    if cal is not None:
        b = cal.get("band") or {}
        if _finite(cal.get("measured"), b.get("lo"), b.get("hi")) and "steps" not in b:
            return ValueBand(cal["measured"], b["lo"], b["hi"], b.get("mean", (b["lo"] + b["hi"]) / 2), b.get("seeds"))
        return None
    fixed = (check.get("details") or {}).get("fixed_rule") or {}
    run, base, tol = fixed.get("run"), fixed.get("baseline"), fixed.get("tol")
    if _finite(run, base, tol):
        return ValueBand(run, base - tol * abs(base), base + tol * abs(base), base, None, tol)
    return None


def curve_band(check: Check, part: str = "loss") -> dict[str, Any] | None:
    """The per-step band of the curve check (part "loss" or "grad_norm"), None when it drew none."""
    cal = calibrated(check)
    if cal is None:
        return None
    band = cal.get("band") if part == "loss" else ((cal.get("details") or {}).get("grad_norm") or {}).get("band")
    return band if isinstance(band, dict) and band.get("steps") else None


def curve_measured(check: Check, part: str = "loss") -> dict[str, Any]:
    m = (calibrated(check) or {}).get("measured")
    m = m if isinstance(m, dict) else {}
    return m if part == "loss" else (m.get("grad_norm") or {})


def judged(history: History, name: str, level: str = "L1") -> list[Judged]:
    """Every run's result of one check, in attempt order (short runs before full runs within an attempt)."""
    out = []
    for i, a in enumerate(history.attempts):
        for entry in sorted(a.checks, key=lambda e: e.kind != "short"):
            out += [Judged(a.number, i, entry.kind, entry.run_dir, c) for c in entry.checks
                    if c.get("name") == name and c.get("level") == level]
    return out
