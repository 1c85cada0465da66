"""The migration report: one self-contained HTML file and its markdown twin, built from a journal.

`write_report` is what the CLI and the supervisor call; the figures are also written as PNG files
beside the markdown so that it renders on its own (the HTML embeds them and needs nothing else).
"""

from __future__ import annotations

from pathlib import Path

from ladder.report.build import ReportData, gather
from ladder.report.figures import figures
from ladder.report.render import notes_markdown, render_html, render_markdown

__all__ = ["ReportData", "gather", "notes_markdown", "render_html", "render_markdown", "write_report"]


def _slug(title: str) -> str:
    return "".join(ch if ch.isalnum() else "-" for ch in title.lower()).strip("-")


def write_report(journal_path: Path, html_path: Path, root: Path | None = None) -> tuple[Path, Path, ReportData]:
    """Write html_path and its markdown twin (same name, .md); return both paths and the data shown."""
    data = gather(Path(journal_path), root)
    html_path = Path(html_path)
    html_path.parent.mkdir(parents=True, exist_ok=True)
    tmp = html_path.with_suffix(".html.tmp")
    figs = figures(data)
    tmp.write_text(render_html(data, figs), encoding="utf-8")
    tmp.replace(html_path)
    md_path = html_path.with_suffix(".md")
    images = {}
    for f in figs:
        png_path = html_path.with_name(f"{html_path.stem}-{_slug(f.title)}.png")
        png_path.write_bytes(f.png)
        images[f.title] = png_path.name
    md_path.write_text(render_markdown(data, images), encoding="utf-8")
    return html_path, md_path, data
