"""Render the report as one self-contained HTML file (figures embedded as base64 PNG) and a markdown twin.

Both are built from the same ReportData and carry the same numbers; every text from the journal is
HTML-escaped (run evidence holds log lines, which may hold anything).
"""

from __future__ import annotations

import base64
import html
import time
from typing import Any

from ladder.journal.audit import AttemptView, NoteView, fmt_duration, fmt_num, fmt_pct, audit_markdown
from ladder.journal.entries import CheckEntry
from ladder.checks.results import level_index
from ladder.report.build import ReportData
from ladder.report.parity import parity_html, parity_markdown
from ladder.report.figures import Figure, figures
from ladder.report.plots import attempt_color
from ladder.report.words import detail, first_failed, headline, measured_text

STATUS_MARK = {"passed": "passed", "failed": "FAILED", "not_checked": "not checked", "not_applicable": "n/a",
               "undecided": "undecided"}
GREY = ("not_checked", "not_applicable")  # could not measure, or nothing to measure: never green

CSS = """
body{font-family:-apple-system,'Segoe UI',Roboto,'DejaVu Sans',Arial,sans-serif;margin:0;background:#f4f5f7;color:#1d2330}
main{max-width:1240px;margin:0 auto;padding:24px 32px 64px}
h1{font-size:26px;margin:8px 0 4px}h2{font-size:20px;margin:34px 0 10px;border-bottom:2px solid #d8dce3;padding-bottom:4px}
h3{font-size:16px;margin:18px 0 6px}
.sub{color:#5a6272;font-size:13px}
.cards{display:flex;flex-wrap:wrap;gap:12px;margin:16px 0}
.card{background:#fff;border:1px solid #dfe3ea;border-radius:8px;padding:10px 16px;min-width:150px}
.card .v{font-size:24px;font-weight:600}.card .k{font-size:12px;color:#5a6272}
table.checks{table-layout:fixed}
table{border-collapse:collapse;background:#fff;width:100%;font-size:13px;margin:6px 0 12px}
th,td{border:1px solid #dfe3ea;padding:5px 8px;text-align:left;vertical-align:top}
th{background:#eef0f4;font-weight:600}
td.num{text-align:right;font-variant-numeric:tabular-nums}
td.status{font-weight:600;white-space:nowrap}
.passed{background:#def3e4;color:#17773a}.failed{background:#fde2e0;color:#b3261e}
.undecided{background:#ece3fb;color:#5b2fa0}.grey{background:#eceef1;color:#6b7280;font-weight:400}
table.summary td{font-size:14px}table.summary td.first{color:#3a4150}
details.more summary{cursor:pointer;color:#5a6272;font-size:12px}
details.more pre{white-space:pre-wrap;font-size:12px;margin:4px 0;color:#3a4150}
figure{margin:14px 0}figcaption{font-size:12px;color:#5a6272}
.ev{font-family:ui-monospace,Menlo,Consolas,monospace;font-size:12px;word-break:break-word}
.attempt{background:#fff;border:1px solid #dfe3ea;border-left:6px solid var(--c);border-radius:8px;padding:8px 18px 10px;margin:14px 0}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;font-weight:600;margin-left:6px}
.over{background:#fde2e0;color:#b3261e}.ok{background:#def3e4;color:#17773a}.under{background:#e3ecfb;color:#1b4fa0}
img{width:100%;background:#fff;border:1px solid #dfe3ea;border-radius:8px}
.note{background:#fff;border:1px solid #dfe3ea;border-radius:8px;padding:8px 14px;margin:10px 0}
.silent{background:#fff4d6;color:#7a5a00}.loud{background:#eceff3;color:#444}
.problems{background:#fde2e0;border:1px solid #f3b2ac;border-radius:8px;padding:8px 14px}
"""


def _e(x: Any) -> str:
    return html.escape("" if x is None else str(x))


def _img(png: bytes, alt: str) -> str:
    return f'<img alt="{_e(alt)}" src="data:image/png;base64,{base64.b64encode(png).decode()}">'


def _val(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    return "" if v is None else str(v)


def _short(v: Any, limit: int = 90) -> str:
    """A measured/threshold cell: long values (optimizer groups) are cut, the full value is the tooltip."""
    text = _val(v)
    if len(text) <= limit:
        return _e(text)
    return f'<span title="{_e(text)}">{_e(text[:limit])}…</span>'


def _verdict(a: AttemptView) -> tuple[str, str]:
    if not a.declared or not a.checked:
        return "", "unjudged"
    gap = level_index(a.declared_level) - level_index(a.achieved_level)
    if gap > 0:
        return "over", f"overclaimed by {gap} level{'s' if gap > 1 else ''}"
    return ("ok", "as declared") if gap == 0 else ("under", f"exceeded the declaration by {-gap}")


# ------------------------------------------------------------------ HTML

def _cards(d: ReportData) -> str:
    a, h = d.audit, d.history
    m = a.migrations[0] if a.migrations else None
    firsts = {s.level: s for s in (m.milestones if m else [])}
    cards = [("attempts", str(a.attempts)), ("final level", (m.final_level if m else None) or "none"),
             ("overclaim rate", f"{fmt_pct(a.overclaim_rate)} ({a.overclaims}/{a.judged})"),
             ("mean overclaim", f"{fmt_num(a.mean_overclaim_levels)} levels"),
             ("silent failures", f"{fmt_pct(a.silent_share)} ({a.silent_failures}/{a.failures})"),
             ("interventions", str(a.interventions))]
    for lvl in ("L0", "L2", "L3"):
        s = firsts.get(lvl)
        cards.append((f"first {lvl}", "never" if s is None or s.attempt is None else
                      f"attempt {s.attempt} · {fmt_duration(s.elapsed_s)}"))
    if m and m.cost_usd is not None:
        cards.append(("agent cost", f"${m.cost_usd:.2f}"))
    cards.append(("journal", "verified" if d.verify.ok else "FAILED verification"))
    body = "".join(f'<div class="card"><div class="v">{_e(v)}</div><div class="k">{_e(k)}</div></div>'
                   for k, v in cards)
    return f'<div class="cards">{body}</div>' + ("" if h.stop is None else
                                                f'<p class="sub">stopped: {_e(h.stop.reason)}</p>')


def _matrix_html(d: ReportData) -> str:
    mx = d.audit.matrix
    if not mx:
        return "<p>No attempt has both a declaration and a check yet.</p>"
    cols = sorted({c for row in mx.values() for c in row}, key=lambda c: level_index(None if c == "none" else c),
                  reverse=True)
    head = "".join(f"<th>{_e(c)}</th>" for c in cols)
    rows = "".join(f"<tr><th>{_e(r)}</th>" + "".join(f'<td class="num">{row.get(c, 0)}</td>' for c in cols) + "</tr>"
                   for r, row in mx.items())
    return f"<table style='width:auto'><tr><th>declared \\ achieved</th>{head}</tr>{rows}</table>"


def status_cell(status: str) -> str:
    cls = f"status {status}" + (" grey" if status in GREY else "")
    return f"<td class='{_e(cls)}'>{_e(STATUS_MARK.get(status, status))}</td>"


def _evidence_cell(r: dict[str, Any]) -> str:
    more = detail(r)
    folded = (f"<details class='more'><summary>statistical detail</summary><pre>{_e(more)}</pre></details>"
              if more else "")
    return f"<td>{_e(headline(r))}{folded}</td>"


def _checks_html(c: CheckEntry) -> str:
    rows = [f"<tr><td>{_e(r.get('level'))}</td><td>{_e(str(r.get('name', '')).replace('_', ' '))}</td>"
            f"{status_cell(r.get('status', ''))}<td class='ev'>{_short(measured_text(r), 160)}</td>"
            f"{_evidence_cell(r)}</tr>" for r in c.checks]
    return (f"<h3>{_e(c.kind)} run {_e(c.run_dir)}: achieved {_e(c.achieved_level or 'none')}</h3>"
            "<table class='checks'><colgroup><col style='width:4%'><col style='width:12%'><col style='width:8%'>"
            "<col style='width:30%'><col style='width:46%'></colgroup>"
            "<tr><th>level</th><th>check</th><th>status</th><th>measured vs threshold</th>"
            f"<th>evidence</th></tr>{''.join(rows)}</table>")


def summary_rows(d: ReportData) -> list[list[str]]:
    """attempt, change, declared, achieved, first failed check: one row per attempt, as journaled."""
    return [[str(a.number), a.attempt.summary if a.attempt is not None else "",
             (a.declared_level or "none") if a.declared else "no claim", a.achieved_level or "none",
             first_failed(a)] for a in d.history.attempts]


def _summary_html(d: ReportData) -> str:
    rows = []
    for a, row in zip(d.history.attempts, summary_rows(d)):
        cls, verdict = _verdict(a)
        badge = f'<span class="badge {cls}">{_e(verdict)}</span>' if cls else ""
        rows.append(f"<tr class='attempt-row' data-attempt='{a.number}'><td class='num'>{_e(row[0])}</td>"
                    f"<td>{_e(row[1])}</td><td>{_e(row[2])}</td><td>{_e(row[3])}{badge}</td>"
                    f"<td class='first'>{_short(row[4], 200)}</td></tr>")
    return ("<table class='summary'><colgroup><col style='width:6%'><col style='width:34%'><col style='width:8%'>"
            "<col style='width:17%'><col style='width:35%'></colgroup><tr><th>attempt</th><th>change</th>"
            "<th>declared</th><th>achieved</th><th>first failed check</th></tr>" + "".join(rows) + "</table>")


def _figure_html(f: Figure) -> str:
    return (f"<figure data-shows='{_e('|'.join(f.shows))}'>{_img(f.png, f.title)}"
            f"<figcaption>{_e(f.title)}: {_e(', '.join(f.shows))}</figcaption></figure>")


def _attempt_html(i: int, a: AttemptView) -> str:
    cls, verdict = _verdict(a)
    info = a.attempt
    decl = a.declaration
    lines = [f'<div class="attempt" style="--c:{attempt_color(i)}">',
             f"<h3>Attempt {a.number}: declared {_e(a.declared_level or 'none') if a.declared else '(no declaration)'}, "
             f"achieved {_e(a.achieved_level or 'none')}"
             + (f'<span class="badge {cls}">{_e(verdict)}</span>' if cls else "") + "</h3>"]
    if info is not None:
        parent = "—" if info.parent is None else info.parent
        lines.append(f"<p class='sub'>agent {_e(info.agent)} · parent {_e(parent)} · branch {_e(info.branch)} "
                     f"· commit {_e(info.commit[:12])} · {_e(info.diff_stat)}</p><p>{_e(info.summary)}</p>")
    if decl is not None:
        lines.append(f"<p><b>Declared {_e(decl.level or 'none')}</b> by {_e(a.declared_by)}: {_e(decl.rationale)}</p>")
    extra = [f"wall {fmt_duration(a.wall_s)}"]
    if a.cost is not None:
        extra.append(f"agent {a.cost.input_tokens or 0}+{a.cost.output_tokens or 0} tokens, "
                     f"${fmt_num(a.cost.cost_usd)}, {a.cost.turns or 0} turns")
    lines.append(f"<p class='sub'>{_e(' · '.join(extra))}</p>")
    lines += [_checks_html(c) for c in a.checks] + [parity_html(a.checks)]
    lines.append("</div>")
    return "\n".join(lines)


def _note_html(n: NoteView) -> str:
    note = n.note
    tag = '<span class="badge silent">silent</span>' if note.silent else '<span class="badge loud">visible</span>'
    parts = [f'<div class="note"><h3>#{n.seq} · attempt {_e(n.attempt)} · {_e(note.check)} {tag}</h3>',
             f"<p><b>Cause:</b> {_e(note.cause)}</p><p><b>Diagnosis:</b> {_e(note.diagnosis)}</p>"]
    if note.diagnosis_llm:
        parts.append(f"<p><b>In plain words:</b> {_e(note.diagnosis_llm)}</p>")
    parts.append(f"<p><b>Fix:</b> {_e(n.fix) if n.fix else '<i>not yet recorded</i>'}"
                 + (f" <span class='sub'>({_e(n.fixed_by)})</span>" if n.fix else "") + "</p>")
    parts.append(f"<p class='sub'>run {_e(note.run_dir or 'none: the attempt was rejected before any run')}</p></div>")
    return "".join(parts)


def render_html(d: ReportData, figs: list[Figure] | None = None) -> str:
    h, m = d.history, d.history.migration
    title = f"ladder report: {h.name}"
    sub = (f"{_e(m.reference_platform)} → {_e(m.target_platform)} · protocol {_e(m.protocol)} · "
           if m else "") + f"generated {time.strftime('%Y-%m-%d %H:%M')}"
    if h.baseline is not None:
        sub += (f" · baseline v{h.baseline.version} ({len(h.baseline.seeds)} seed(s), digest "
                f"{_e(h.baseline.digest[:12])})")
    out = [f"<!doctype html><html lang='en'><head><meta charset='utf-8'><title>{_e(title)}</title>"
           f"<style>{CSS}</style></head><body><main>", f"<h1>{_e(title)}</h1><p class='sub'>{sub}</p>",
           _summary_html(d), _cards(d)]
    problems = ([f"journal: {p}" for p in d.verify.problems] + d.problems)
    if problems:
        out.append("<div class='problems'><b>Problems</b><ul>" + "".join(f"<li>{_e(p)}</li>" for p in problems)
                   + "</ul></div>")
    out.append("<h2>What the L1 checks judged, against the baseline's bands</h2>")
    out += [_figure_html(f) for f in (figures(d) if figs is None else figs)]
    out += ["<h2>Declared against achieved</h2>", _matrix_html(d),
            "<h2>Attempts</h2>"] + [_attempt_html(i, a) for i, a in enumerate(h.attempts)]
    out.append(f"<h2>Failure notes ({len(h.notes)})</h2>")
    out += [_note_html(n) for n in h.notes] or ["<p>No failure notes.</p>"]
    if h.decisions:
        out.append("<h2>Human interventions</h2><table><tr><th>rule</th><th>decision</th><th>by</th><th>reason</th></tr>"
                   + "".join(f"<tr><td>{_e(x.rule)}</td><td>{_e(x.decision)}</td><td>{_e(x.by)}</td>"
                             f"<td>{_e(x.reason)}</td></tr>" for x in h.decisions) + "</table>")
    out.append("</main></body></html>")
    return "\n".join(out)


# ------------------------------------------------------------------ markdown twin

def notes_markdown(notes: list[NoteView]) -> str:
    if not notes:
        return "No failure notes.\n"
    out = []
    for n in notes:
        note = n.note
        out += [f"### #{n.seq} attempt {n.attempt}: {note.check} ({'silent' if note.silent else 'visible'})", "",
                f"- cause: {note.cause}", f"- diagnosis: {note.diagnosis}"]
        if note.diagnosis_llm:
            out.append(f"- in plain words: {note.diagnosis_llm}")
        out += [f"- fix: {n.fix or '(not yet recorded)'}", f"- silent: {'yes' if note.silent else 'no'}",
                f"- run: {note.run_dir or '(none)'}", ""]
    return "\n".join(out)


def _md_cell(x: Any) -> str:
    return _val(x).replace("|", "\\|").replace("\n", " ")


def render_markdown(d: ReportData, images: dict[str, str] | None = None) -> str:
    """images: figure title -> relative path of a PNG written beside the markdown (optional)."""
    h = d.history
    out = [f"# ladder report: {h.name}", "", "| attempt | change | declared | achieved | first failed check |",
           "|---|---|---|---|---|", *("| " + " | ".join(map(_md_cell, row)) + " |" for row in summary_rows(d)), ""]
    if d.verify.problems or d.problems:
        out += ["**Problems:**", ""] + [f"- {p}" for p in [*d.verify.problems, *d.problems]] + [""]
    else:
        out += ["Journal verified: every entry and referenced directory is intact.", ""]
    out.append(audit_markdown(d.audit))
    for title, path in (images or {}).items():
        out += [f"![{title}]({path})", ""]
    out.append("## Attempts\n")
    for a in h.attempts:
        _, verdict = _verdict(a)
        out += [f"### Attempt {a.number}: declared {a.declared_level or 'none'}, achieved "
                f"{a.achieved_level or 'none'} ({verdict})", ""]
        if a.attempt is not None:
            out += [f"{a.attempt.summary} (agent {a.attempt.agent}, branch {a.attempt.branch}, "
                    f"commit {a.attempt.commit[:12]})", ""]
        if a.declaration is not None:
            out += [f"Declared by {a.declared_by}: {a.declaration.rationale}", ""]
        for c in a.checks:
            out += [f"{c.kind} run `{c.run_dir}`: achieved {c.achieved_level or 'none'}", "",
                    "| level | check | status | measured vs threshold | evidence |", "|---|---|---|---|---|"]
            out += [f"| {r.get('level')} | {r.get('name')} | {r.get('status')} | {_md_cell(measured_text(r))} | "
                    f"{_md_cell(r.get('evidence'))} |" for r in c.checks]
            out.append("")
        out += parity_markdown(a.checks)
    out += ["## Failure notes", "", notes_markdown(h.notes)]
    return "\n".join(out)
