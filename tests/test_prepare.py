"""The prepare step (once per source digest, read-only for runs) and runs of two sides that differ."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from helpers import workspace
from ladder._util.errors import LadderError
from ladder.migration.spec import SpecWarning, load_spec
from ladder.runs.execute import execute_run
from ladder.runs.runner.sandbox import bwrap_works


@pytest.fixture()
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "cache"))
    return workspace(tmp_path, "twosided")


def _spec(ws: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        return load_spec(ws / "ladder.toml")


def _prepared_dirs(ws: Path) -> list[Path]:
    return sorted(p for p in (ws.parent / "cache" / "prepared").iterdir() if p.is_dir())


def test_both_sides_run_their_own_command_in_their_own_cwd_and_parse_their_own_lines(ws: Path) -> None:
    spec = _spec(ws)
    ref = execute_run(spec, "reference", "short", seed=3)
    tgt = execute_run(spec, "target", "short", seed=3, source=ws / "port")
    assert ref.exit_code == 0 and tgt.exit_code == 0, (ref.last_lines, tgt.last_lines)
    assert "main.py --random-seed 3 --num-steps 100" in tgt.command and tgt.cwd.endswith("work/src")
    assert [p.loss for p in tgt.loss_curve] == [p.loss for p in ref.loss_curve] and len(ref.loss_curve) == 20
    assert tgt.metric == ref.metric and tgt.metric_name == "mse"
    # {prepared} and $LADDER_PREPARED name the cached data, which each side's own prepare step made
    out = _prepared_out(tgt)
    assert f"--data {out}/data/numbers.txt" in tgt.command and f"prepared dir {out}" in tgt.first_lines
    assert _prepared_out(ref) != out and len(_prepared_dirs(ws)) == 2
    assert (Path(ref.cwd) / "data").is_symlink() and (Path(tgt.cwd).parent / "data").is_symlink()


def _prepared_out(record) -> str:
    note = next(n for n in record.notes if n.startswith("prepared data "))
    return note.rsplit(": ", 1)[1]


def test_prepare_runs_once_per_source_digest_and_prepare_inputs_narrow_it(ws: Path) -> None:
    spec = _spec(ws)
    execute_run(spec, "reference", "short", seed=0)
    full = execute_run(spec, "target", "full", seed=0, source=ws / "port")  # --data ../data: a link in its copy
    assert full.exit_code == 0 and full.metric is not None and len(_prepared_dirs(ws)) == 2
    (ws / "repo" / "train.py").write_text((ws / "repo" / "train.py").read_text() + "\n# edited\n")
    again = execute_run(spec, "reference", "short", seed=1)
    assert any("(cached)" in n for n in again.notes)  # prepare_inputs = ["prepare_data.py"]: still valid
    (ws / "port" / "src" / "main.py").write_text((ws / "port" / "src" / "main.py").read_text() + "\n# edited\n")
    execute_run(spec, "target", "short", seed=0, source=ws / "port")  # every file is an input: it prepares again
    assert len(_prepared_dirs(ws)) == 3
    (ws / "repo" / "prepare_data.py").write_text((ws / "repo" / "prepare_data.py").read_text() + "\n# v2\n")
    r = execute_run(spec, "reference", "short", seed=0)
    assert any("prepared now" in n for n in r.notes) and len(_prepared_dirs(ws)) == 4


@pytest.mark.skipif(bwrap_works() is not None, reason="needs bubblewrap")
def test_a_run_cannot_write_the_prepared_data(ws: Path) -> None:
    spec = _spec(ws)
    spec.experiment.short += " --try-write"
    r = execute_run(spec, "reference", "short", seed=0)
    assert "write refused: OSError" in r.first_lines, r.first_lines
    assert r.exit_code == 0 and r.metric is not None


def test_a_failed_prepare_is_a_clear_error_and_leaves_nothing_cached(ws: Path) -> None:
    text = (ws / "ladder.toml").read_text().replace('prepare = ["{python} prepare_data.py"]\nprepare_inputs',
                                                    'prepare = ["{python} -c \'raise SystemExit(3)\'"]\nprepare_inputs')
    (ws / "ladder.toml").write_text(text)
    with pytest.raises(LadderError) as e:
        execute_run(_spec(ws), "reference", "short", seed=0)
    assert "prepare command 1 failed (exit 3)" in str(e.value) and "prepare" in (e.value.fix or "")
    assert not any((d / ".ladder-ready").exists() for d in _prepared_dirs(ws))


def test_a_profiles_pythonpath_reaches_the_run_behind_the_probe(ws: Path, tmp_path: Path) -> None:
    """A profile's `env = { PYTHONPATH = ... }` (a no-op module for a script that plots at its end, say) is
    kept after the probe's directory instead of being replaced by it."""
    shims = tmp_path / "shims"
    shims.mkdir()
    (shims / "ladder_test_shim.py").write_text("NAME = 'from the profile'\n")
    spec = _spec(ws)
    spec.profile("reference").env["PYTHONPATH"] = str(shims)
    spec.experiment.short = ("{python} -c \"import ladder_test_shim, sys; print('shim:', ladder_test_shim.NAME); "
                             "print('probe:', '_ladder_probe' in sys.modules)\"")
    r = execute_run(spec, "reference", "short", seed=0)
    assert r.exit_code == 0, r.last_lines
    assert "shim: from the profile" in r.first_lines and "probe: True" in r.first_lines, r.first_lines
