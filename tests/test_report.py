"""The report of a real tiny migration, and of the recorded demo journal: self-contained HTML and its
markdown twin, rendered in a real headless Chromium (Debian's `chromium`), checked for a non-blank page,
the key numbers, the summary table, the status colours and a figure per judged curve."""

from __future__ import annotations

import base64
import html
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ladder.journal.audit import fmt_num, fmt_pct
from ladder.report import write_report
from ladder.report.judged import curve_band, judged, value_band
from ladder.report.words import band_text, measured_text
from test_journal_cli import build_migration
from test_recorded_examples import JOURNAL, REPO, _copy

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def migration(tmp_path_factory) -> Path:
    return build_migration(tmp_path_factory.mktemp("rep"))


@pytest.fixture(scope="module")
def report(migration: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "report.html"
    return write_report(migration / "journals" / "tiny" / "journal.sqlite", out, migration)


@pytest.fixture(scope="module")
def demo_report(tmp_path_factory):
    ws = _copy(tmp_path_factory.mktemp("demo"))
    return write_report(ws / JOURNAL.relative_to(REPO), ws / "out" / "report.html", ws)


def test_calibrated_cells_read_as_value_against_band(demo_report) -> None:
    _, md_path, data = demo_report
    scalars = [j for name in ("loss_window", "metric") for j in judged(data.history, name)
               if j.check["details"].get("calibrated")]
    assert scalars, "the recorded demo judges its short runs with calibrated bands"
    for j in scalars:
        band = j.check["details"]["calibrated"]["band"]
        cell = measured_text(j.check)
        assert cell == band_text(j.check["details"]["calibrated"]["measured"], band["lo"], band["hi"], band["seeds"])
        assert f"({band['seeds']} seeds)" in cell and "{" not in cell
        assert cell in md_path.read_text()
    fixed = [j for j in judged(data.history, "loss_window") if j.check["details"].get("fixed_rule")
             and not j.check["details"].get("calibrated")]
    assert fixed
    for j in fixed:  # the full run's one seed: the fixed rule's tolerance is the band
        tol = j.check["details"]["fixed_rule"]["tol"]
        assert measured_text(j.check).endswith(f"(baseline +-{tol:.0%})")
        assert value_band(j.check).lo < j.check["details"]["fixed_rule"]["baseline"] < value_band(j.check).hi


def test_curve_cell_names_the_worst_block_and_where_the_run_leaves_the_band(demo_report) -> None:
    _, _, data = demo_report
    curves = [j for j in judged(data.history, "trend") if curve_band(j.check)]
    assert {j.check["status"] for j in curves} == {"passed", "failed"}
    for j in curves:
        m = j.check["measured"]
        block = curve_band(j.check)["blocks"][m["worst_block"] - 1]
        cell = measured_text(j.check)
        assert cell.startswith(f"worst block #{m['worst_block']} ") and band_text(
            block["value"], block["lo"], block["hi"], block["seeds"]) in cell
        step = m["first_step_outside"]
        assert (f"leaves the band at step {step}" in cell) == (step is not None)


@pytest.mark.slow
def test_html_is_self_contained_with_plots_and_a_markdown_twin(report) -> None:
    import matplotlib.image as mpimg

    html_path, md_path, data = report
    html = html_path.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", html), "the report must need no other file"
    assert "<script" not in html
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    titles = re.findall(r'<img alt="([^"]+)"', html)
    # three seeds: the loss window and metric are judged against calibrated bands, drawn in their own figure
    assert titles == ["loss curve, short runs", "gradient norm, short runs",
                      "loss window and metric against their bands"]
    assert len(pngs) == len(titles)
    for b64 in pngs:
        img = mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")
        assert img.shape[1] > 800 and float(np.std(img[..., :3])) > 0.05
    a = data.audit
    md = md_path.read_text()
    for text in (f"overclaim rate: {fmt_pct(a.overclaim_rate)} ({a.overclaims} of {a.judged}",
                 f"silent failures: {fmt_pct(a.silent_share)} ({a.silent_failures} of {a.failures}",
                 "RuntimeError: simulated crash"):
        assert text in md, text
    assert _rates(a)[0] in html and _rates(a)[1] in html and "verified" in html
    assert (a.attempts, a.judged) == (3, 3) and a.failures >= 1
    for title in ("loss-curve--short-runs", "gradient-norm--short-runs"):
        assert (html_path.parent / f"report-{title}.png").is_file() and f"report-{title}.png" in md


def _rates(a) -> tuple[str, str]:  # noqa: ANN001
    """The overclaim and silent-failure cards as the audit computed them."""
    return (f"{fmt_pct(a.overclaim_rate)} ({a.overclaims}/{a.judged})",
            f"{fmt_pct(a.silent_share)} ({a.silent_failures}/{a.failures})")


def _chromium(*args: str, tmp: Path) -> subprocess.CompletedProcess:
    return subprocess.run([CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                           "--disable-component-update", "--disable-sync", "--no-first-run",
                           f"--user-data-dir={tmp / 'chromium-profile'}", *args],
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install -y chromium")
def test_report_renders_in_headless_chromium(report, tmp_path: Path) -> None:
    import matplotlib.image as mpimg

    html_path, _, data = report
    shot = tmp_path / "shot.png"
    p = _chromium(f"--screenshot={shot}", "--window-size=1400,3000", html_path.as_uri(), tmp=tmp_path)
    assert shot.is_file(), p.stderr[-2000:]
    img = mpimg.imread(shot)
    assert img.shape[:2] == (3000, 1400)
    assert float(np.var(img[..., :3])) > 0.005, "blank page"
    # The plots are drawn: the top half holds many distinct colours, not just text on a background.
    top = (img[:1500, :, :3] * 255).astype(np.uint8).reshape(-1, 3)
    assert len(np.unique(top, axis=0)) > 500

    dom = _chromium("--dump-dom", html_path.as_uri(), tmp=tmp_path).stdout
    text = re.sub(r"<[^>]+>", " ", dom)
    text = re.sub(r"\s+", " ", text)
    a1 = data.history.attempts[0]
    for needle in ("ladder report: tiny", *_rates(data.audit), f"{fmt_num(data.audit.mean_overclaim_levels)} levels",
                   f"Attempt 1: declared {a1.declared_level}, achieved {a1.achieved_level or 'none'}",
                   "RuntimeError: simulated crash in the training step", *(n.note.cause for n in data.history.notes),
                   f"Failure notes ({len(data.history.notes)})", "declared \\ achieved"):
        assert re.sub(r"\s+", " ", html.escape(needle, quote=False)) in text, needle


def _tags(dom: str, tag: str, attr: str) -> list[tuple[str, str]]:
    """(attribute value, inner html) of every <tag> carrying attr, from Chromium's serialised DOM."""
    return re.findall(rf'<{tag}[^>]*?{attr}="([^"]*)"[^>]*>(.*?)</{tag}>', dom, flags=re.S)


def _cells(dom: str) -> list[tuple[str, str]]:
    """(class, text) of every table cell."""
    return [(c, re.sub(r"<[^>]+>", "", t).strip()) for c, t in _tags(dom, "td", "class")]


@pytest.mark.skipif(CHROMIUM is None, reason="needs Debian's chromium: apt-get install -y chromium")
def test_demo_report_in_chromium_summary_statuses_and_a_figure_per_judged_curve(demo_report, tmp_path: Path) -> None:
    html_path, _, data = demo_report
    dom = _chromium("--dump-dom", html_path.as_uri(), tmp=tmp_path).stdout
    assert dom.index("class=\"summary\"") < dom.index("<h2>"), "the summary table comes first"

    rows = _tags(dom, "tr", "data-attempt")
    assert [int(n) for n, _ in rows] == [a.number for a in data.history.attempts]
    for (_, row), a in zip(rows, data.history.attempts):
        cells = [html.unescape(re.sub(r"<[^>]+>", "", c)).strip() for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        assert cells[1] == a.attempt.summary and cells[3].startswith(a.achieved_level or "none")
        failed = sorted((c["level"], e.kind != "short", c["name"]) for e in a.checks for c in e.checks
                        if c["status"] == "failed")
        if failed:  # the lowest-level failed check, in words
            level, full, name = failed[0]
            assert cells[4].startswith(f"{level} {name.replace('_', ' ')}, {'full' if full else 'short'} run: ")

    cells = _cells(dom)
    statuses = [c for c in cells if c[0].startswith("status ")]
    grey = [c for c in statuses if c[1] in ("not checked", "n/a")]
    assert grey and all("grey" in c.split() and "passed" not in c.split() for c, _ in grey)
    assert all(c.split() == ["status", "passed"] for c, t in statuses if t == "passed")
    assert {c.split()[1] for c, _ in statuses} >= {"passed", "failed", "undecided", "not_checked"}

    shows = {s for v, _ in _tags(dom, "figure", "data-shows") for s in v.split("|")}
    for part in ("loss", "grad_norm"):
        for j in judged(data.history, "trend"):
            if curve_band(j.check, part):
                assert f"attempt {j.attempt} {j.kind}" in shows, (part, j.attempt, j.kind)
    values = [j for n in ("loss_window", "metric") for j in judged(data.history, n) if value_band(j.check)]
    assert values and all(f"attempt {j.attempt} {j.kind}" in shows for j in values)
    assert "<details" in dom and "statistical detail" in dom and "{'hi'" not in dom


@pytest.mark.slow
def test_missing_run_dir_is_reported_not_fatal(migration: Path, tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    shutil.copytree(migration, ws)
    gone = sorted((ws / "runs" / "tiny").iterdir())[0]
    shutil.rmtree(gone)
    html_path, md_path, data = write_report(ws / "journals" / "tiny" / "journal.sqlite", tmp_path / "r.html", ws)
    assert not data.verify.ok
    assert any(f"runs/tiny/{gone.name}: directory is missing" in p for p in data.verify.problems)
    assert any(gone.name in p for p in data.problems)
    assert "directory is missing" in html_path.read_text() and "directory is missing" in md_path.read_text()
