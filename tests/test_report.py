"""The report of a real tiny migration: self-contained HTML and its markdown twin, rendered in a real
headless Chromium (Debian's `chromium`), checked for a non-blank page and for the key numbers."""

from __future__ import annotations

import base64
import io
import re
import shutil
import subprocess
from pathlib import Path

import numpy as np
import pytest

from ladder.runs.records import LossPoint, Provenance, RunRecord
from ladder.report import write_report
from ladder.report.plots import seed_band
from test_journal_cli import build_migration

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


@pytest.fixture(scope="module")
def migration(tmp_path_factory) -> Path:
    return build_migration(tmp_path_factory.mktemp("rep"))


@pytest.fixture(scope="module")
def report(migration: Path, tmp_path_factory):
    out = tmp_path_factory.mktemp("out") / "report.html"
    return write_report(migration / "journals" / "tiny" / "journal.sqlite", out, migration)


def _record(seed: int, losses: list[float]) -> RunRecord:
    return RunRecord(run_id=f"s{seed}", kind="short", profile="reference", platform="cpu", seed=seed, command="x",
                     cwd="/", started_at=0.0, timeout_s=1.0, provenance=Provenance(source="t"),
                     loss_curve=[LossPoint(step=5 * (i + 1), loss=v, t=float(i)) for i, v in enumerate(losses)])


def test_seed_band_is_min_mean_max_over_common_steps() -> None:
    steps, lo, mean, hi = seed_band([_record(0, [3.0, 2.0, 1.0]), _record(1, [5.0, 2.0, 0.0, 9.0])])
    assert steps.tolist() == [5, 10, 15]  # step 20 is covered by one seed only
    assert lo.tolist() == [3.0, 2.0, 0.0] and hi.tolist() == [5.0, 2.0, 1.0] and mean.tolist() == [4.0, 2.0, 0.5]
    assert seed_band([_record(0, [1.0, 2.0])]) is None


@pytest.mark.slow
def test_html_is_self_contained_with_plots_and_a_markdown_twin(report) -> None:
    import matplotlib.image as mpimg

    html_path, md_path, data = report
    html = html_path.read_text()
    assert not re.search(r"""(src|href)=["']?(https?:|//|file:)""", html), "the report must need no other file"
    assert "<script" not in html
    pngs = re.findall(r'src="data:image/png;base64,([^"]+)"', html)
    assert len(pngs) == 3  # short-run loss curves and gradient norms, metric per attempt (no full runs here)
    for b64 in pngs:
        img = mpimg.imread(io.BytesIO(base64.b64decode(b64)), format="png")
        assert img.shape[1] > 800 and float(np.std(img[..., :3])) > 0.05
    a = data.audit
    md = md_path.read_text()
    for text in ("overclaim rate: 67% (2 of 3", "silent failures: 50% (1 of 2", "RuntimeError: simulated crash"):
        assert text in md, text
    assert "67% (2/3)" in html and "50% (1/2)" in html and "verified" in html
    assert (a.attempts, a.overclaims, a.failures, a.silent_failures) == (3, 2, 2, 1)
    for title in ("loss-curves--short-runs", "gradient-norms--short-runs", "acc-per-attempt--short-runs"):
        assert (html_path.parent / f"report-{title}.png").is_file() and f"report-{title}.png" in md


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
    smooth = next(n for n in data.history.notes if n.note.check == "L1/loss_window")
    rel = re.search(r"\d+\.\d%", smooth.note.diagnosis).group(0)
    for needle in ("ladder report: tiny", "67% (2/3)", "50% (1/2)", "2.00 levels", "Attempt 1: declared L2, achieved L0",
                   "overclaimed by 2 levels", "RuntimeError: simulated crash in the training step",
                   f"{rel} higher than the baseline", "Failure notes (", "declared \\ achieved"):
        assert needle in text, needle


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
