"""The two example ports of repos that differ from their reference as real ones do, end to end.

For each: a 3-seed reference baseline, one run of the port, the ladder (a faithful port reaches L2 on a
short run); then `ladder init --from-run` on the same commands, whose proposed spec must read the same
loss curve, evaluations and metric from those runs as the committed spec does (no edit needed).
"""

from __future__ import annotations

import re
import shutil
import sys
import warnings
from pathlib import Path

import pytest

from helpers import cli_json
from ladder.migration.from_run import read_run_lines
from ladder.migration.spec import SpecWarning, load_spec
from ladder.runs.parse import OutputParser

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"


def _with_interpreters(spec: Path, pythons: dict[str, str]) -> None:
    """Point each profile at an existing interpreter instead of its setup commands (the same packages)."""
    text = spec.read_text()
    for profile, python in pythons.items():
        head = f"[profiles.{profile}]"
        start = text.index(head)
        end = text.find("\n[", start + len(head))
        end = len(text) if end < 0 else end
        section = re.sub(r'^setup = .*\n', "", text[start:end], flags=re.M)
        section = re.sub(r'^python = .*$', f'python = "{python}"', section, flags=re.M)
        text = text[:start] + section + text[end:]
    spec.write_text(text)


def _read(spec, profile: str, run_dir: Path) -> tuple[list, list, float | None]:
    parser = OutputParser(spec.parse_for(profile))
    for i, line in enumerate(read_run_lines(run_dir)):
        parser.feed(line, float(i))
    return [(p.step, p.loss) for p in parser.curve], [(e.step, e.values) for e in parser.evals], parser.metric


def _end_to_end(tmp_path: Path, example: str, pythons: dict[str, str], init_args: list[str]) -> None:
    ws = tmp_path / example
    shutil.copytree(EXAMPLES / example, ws)
    _with_interpreters(ws / "ladder.toml", pythons)
    cli_json("baseline", "--seeds", "3", "--short-only", cwd=ws)
    run = cli_json("run", "--on", "target", "--source", "port", cwd=ws)
    assert run["exit_code"] == 0, run
    result = cli_json("check", run["run_dir"], cwd=ws)
    status = {f"{c['level']}/{c['name']}": c["status"] for c in result["checks"]}
    assert result["achieved_level"] == "L2", (status, [c["evidence"][:1500] for c in result["checks"] if c["status"] == "failed"])
    assert all(status[k] == "passed" for k in ("L1/loss_window", "L1/metric", "L1/trend", "L2/recompilation",
                                                "L2/optimizer_unchanged", "L2/evaluation_complete")), status

    proposed = tmp_path / "proposed"
    out = cli_json("init", str(proposed), "--source", str(ws / "repo"), "--target-source", str(ws / "port"),
                   "--python", pythons["reference"], "--target-python", pythons["target"], *init_args, cwd=tmp_path)
    assert all(f["ok"] for f in out["findings"]), out["findings"]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        committed, ours = load_spec(ws / "ladder.toml"), load_spec(proposed / "ladder.toml")
    assert ours.parse.direction == committed.parse.direction and ours.probe.seed == committed.probe.seed
    assert ours.experiment.short_steps == committed.experiment.short_steps
    for profile, run_dir in (("reference", ws / "baselines" / committed.name / "v1" / "short-s0"),
                             ("target", Path(run["run_dir"]))):
        want, got = _read(committed, profile, run_dir), _read(ours, profile, run_dir)
        assert got[0] == want[0] and len(got[0]) >= 20, profile  # the same loss curve
        assert [s for s, _ in got[1]] == [s for s, _ in want[1]], profile  # the same evaluations
        assert got[2] == want[2] is not None, profile  # the same metric
        assert ours.command("short", profile).split()[:2] == committed.command("short", profile).split()[:2]


@pytest.mark.slow
@pytest.mark.jax
def test_charlm_torch_to_jax(tmp_path: Path, jax_python: str) -> None:
    _end_to_end(tmp_path, "charlm", {"reference": sys.executable, "target": jax_python}, [
        "--from-run", "python train.py --max_iters=300 --eval_interval=100 --device=cpu --compile=False",
        "--prepare", "python data/names/prepare.py",
        "--target-run", "python main.py --num-steps 300 --eval-every 100",
        "--target-prepare", "python scripts/build_dataset.py --out data"])


@pytest.mark.slow
@pytest.mark.xla
def test_census_torch_to_pytorch_xla(tmp_path: Path, xla_python: str) -> None:
    _end_to_end(tmp_path, "tabular", {"reference": sys.executable, "target": xla_python}, [
        "--from-run", "python fit.py --epochs 20",
        "--prepare", "python scripts/download.py", "--prepare", "python scripts/preprocess.py",
        "--target-run", "PJRT_DEVICE=CPU python run_xla.py --num-epochs 20",
        "--target-prepare", "python tools/make_features.py --out features"])
