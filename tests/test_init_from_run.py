"""`ladder init --from-run`: a spec proposed from real runs of both sides, used without an edit.

The programs are the standard-library pair in fixtures/twosided (other entry point, flags, log lines and
data script on the port's side); Claude, asked for the port's command, is a local fake of the API.
"""

from __future__ import annotations

import json
import sys
import warnings
from pathlib import Path

import pytest

from helpers import FakeAnthropic, ladder_cli, workspace
from ladder.migration.spec import SpecWarning, load_spec
from ladder.runs.execute import execute_run

REFERENCE = "python train.py --seed 0 --steps 100"
PORT = "python src/main.py --random-seed 0 --num-steps 100 --data data/numbers.txt"


@pytest.fixture()
def ws(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "cache"))
    ws = workspace(tmp_path, "twosided")
    (ws / "ladder.toml").unlink()
    return ws


def _init(ws: Path, *extra: str, env: dict | None = None) -> dict:
    p = ladder_cli("init", "--from-run", REFERENCE, "--source", "repo", "--python", sys.executable,
                   "--prepare", "python prepare_data.py", "--json", *extra, cwd=ws, env=env)
    assert p.returncode == 0, p.stderr
    return json.loads(p.stdout)


def test_the_proposed_spec_runs_both_sides_without_an_edit(ws: Path) -> None:
    out = _init(ws, "--target-run", PORT, "--target-source", "port",
                "--target-prepare", "python tools/make_numbers.py --out data")
    assert out["spec"] and all(f["ok"] for f in out["findings"]), out["findings"]
    assert out["warnings"] == []
    with warnings.catch_warnings():
        warnings.simplefilter("error", SpecWarning)
        spec = load_spec(ws / "ladder.toml")
    assert spec.command("short", "reference") == "{python} train.py --seed {seed} --steps {steps}"
    assert spec.command("short", "target") == ("{python} src/main.py --random-seed {seed} --num-steps {steps} "
                                               "--data data/numbers.txt")
    assert spec.experiment.short_steps == 100 and not spec.probe.seed
    assert spec.parse.metric_name == "mse" and spec.parse.direction == "min"
    assert spec.profile("target").prepare == ["{python} tools/make_numbers.py --out data"]
    assert spec.profile("reference").env == {"OMP_NUM_THREADS": "1"}
    ref = execute_run(spec, "reference", "short", seed=2)
    tgt = execute_run(spec, "target", "short", seed=2, source=ws / "port")
    assert len(ref.loss_curve) == 20 and [p.loss for p in tgt.loss_curve] == [p.loss for p in ref.loss_curve]
    assert ref.metric is not None and tgt.metric == ref.metric
    text = (ws / "ladder.toml").read_text()
    assert "--seed (the program takes it" in text and "ladder run --on target --source port" in text


def test_without_a_port_command_or_key_the_target_is_left_to_fill_in(ws: Path) -> None:
    out = _init(ws, "--target-source", "port", env={"ANTHROPIC_API_KEY": ""})
    topics = {(f["side"], f["topic"]) for f in out["findings"]}
    assert ("reference", "loss") in topics and not any(side == "target" for side, _ in topics)
    text = (ws / "ladder.toml").read_text()
    assert "# The port's side: set its platform and python" in text


def test_with_a_key_claude_proposes_the_port_command_from_its_readme(ws: Path) -> None:
    answer = "Here it is:\n" + json.dumps(
        {"command": PORT, "prepare": ["python tools/make_numbers.py --out data"], "why": "the README's two lines"})
    with FakeAnthropic(lambda prompt: answer) as api:
        out = _init(ws, "--target-source", "port", env={"ANTHROPIC_API_KEY": "test-key", "ANTHROPIC_BASE_URL": api.url})
    prompts = [s["body"]["messages"][0]["content"] for s in api.seen]
    assert len(prompts) == 1 and api.seen[0]["key"] == "test-key"
    assert "python tools/make_numbers.py --out data" in prompts[0] and REFERENCE in prompts[0]
    claude = [f for f in out["findings"] if f["side"] == "target" and f["topic"] == "command"]
    assert claude and "proposed by Claude" in claude[0]["why"] and claude[0]["value"] == PORT
    spec = load_spec(ws / "ladder.toml")
    assert spec.command("short", "target").startswith("{python} src/main.py --random-seed {seed}")
    assert execute_run(spec, "target", "short", seed=0, source=ws / "port").metric is not None


def test_an_existing_spec_is_kept_and_targets_need_from_run(ws: Path) -> None:
    (ws / "ladder.toml").write_text("keep me")
    p = ladder_cli("init", "--from-run", REFERENCE, cwd=ws)
    assert p.returncode == 2 and "already exists" in p.stderr and (ws / "ladder.toml").read_text() == "keep me"
    p = ladder_cli("init", str(ws / "other"), "--target-run", PORT, cwd=ws)
    assert p.returncode == 2 and "need --from-run" in p.stderr
