"""The report's parity table of an attempt: tensor, max abs diff, rel diff, cosine, verdict.

Read from the attempt's L1 `parity` check as journaled (its details carry every compared tensor), so the
table shows exactly what the verdict was computed from. Must not: recompute anything.
"""

from __future__ import annotations

import html
from typing import Any

from ladder.journal.entries import CheckEntry

HEADERS = ("tensor", "max |diff|", "rel diff", "cosine", "verdict")


def parity_result(checks: list[CheckEntry]) -> dict[str, Any] | None:
    """The attempt's parity check with its rows (the first journaled one: parity does not change per run)."""
    for entry in checks:
        for c in entry.checks:
            if c.get("name") == "parity" and (c.get("details") or {}).get("rows"):
                return c
    return None


def parity_rows(check: dict[str, Any]) -> list[list[str]]:
    return [[r["tensor"], f"{r['max_abs_diff']:.3g}", f"{r['rel_diff']:.3g}", f"{r['cosine']:.7f}",
             "ok" if r["passed"] else "DIFFERS"] for r in check["details"]["rows"]]


def _caption(check: dict[str, Any]) -> str:
    d = check["details"]
    first = d.get("first_failure")
    what = f"first tensor that differs: {first['tensor']}" if first else "every tensor within tolerance"
    return f"parity ({d.get('tolerance')}): {what}"


def parity_html(checks: list[CheckEntry]) -> str:
    check = parity_result(checks)
    if check is None:
        return ""
    head = "".join(f"<th>{h}</th>" for h in HEADERS)
    body = "".join("<tr>" + "".join(f"<td class='{'failed' if v == 'DIFFERS' else 'num' if i else 'ev'}'>"
                                    f"{html.escape(v)}</td>" for i, v in enumerate(row)) + "</tr>"
                   for row in parity_rows(check))
    return f"<h3>{html.escape(_caption(check))}</h3><table style='width:auto'><tr>{head}</tr>{body}</table>"


def parity_markdown(checks: list[CheckEntry]) -> list[str]:
    check = parity_result(checks)
    if check is None:
        return []
    return [_caption(check), "", "| " + " | ".join(HEADERS) + " |", "|---|---|---|---|---|",
            *("| " + " | ".join(row) + " |" for row in parity_rows(check)), ""]
