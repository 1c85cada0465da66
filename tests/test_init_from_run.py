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


def test_a_side_whose_run_failed_leaves_a_draft_not_a_spec(ws: Path) -> None:
    # the port's data is never prepared (no --target-prepare): it crashes opening it
    args = ("init", "--from-run", REFERENCE, "--source", "repo", "--python", sys.executable,
            "--prepare", "python prepare_data.py", "--target-run", PORT, "--target-source", "port", "--json")
    p = ladder_cli(*args, cwd=ws)
    assert p.returncode == 2 and "target's run failed (exit 1)" in p.stderr and "--force" in p.stderr, p.stderr
    out = json.loads(p.stdout)
    assert out["spec"] is None and not (ws / "ladder.toml").exists()
    failed = [f for f in out["findings"] if f["side"] == "target" and f["topic"] == "run" and not f["ok"]]
    assert failed and "the program failed" in failed[0]["why"]
    draft = Path(out["draft"]).read_text()
    assert "[profiles.target.parse]: not proposed, its run failed (exit 1)" in draft

    forced = ladder_cli(*args, "--force", cwd=ws)
    assert forced.returncode == 0, forced.stderr
    spec = load_spec(ws / "ladder.toml")  # valid; the port reads with the reference's patterns until set
    assert spec.profile("target").parse is None and spec.parse.metric_name == "mse"


def test_a_default_run_longer_than_the_full_run_bound_is_not_proposed(tmp_path: Path) -> None:
    from ladder.migration.from_run import Side, full_run_steps, render_spec

    side = Side("reference", "{python} train.py --max_iters={steps}", sys.executable, "cpu", tmp_path,
                steps=200, full_steps=600000, wall_s=60.0, exit_code=0)
    steps, why = full_run_steps(side, 200, 5.0)
    assert steps == 2000 and "600000 would take about 50 h" in why  # 60 s per 200 steps
    side.wall_s = 2.0  # 600000 steps at 100 steps/s: 1.7 h, within the bound
    assert full_run_steps(side, 200, 5.0) == (600000, "the program's default --steps (600000)")
    side.wall_s = 60.0
    text = render_spec("x", tmp_path, side, None)
    assert "full_steps = 2000 " in text and "expected_minutes_full = 15.0" in text
    assert any(f.topic == "full_steps" and not f.ok for f in side.findings)


def _one_file_repo(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, train_py: str) -> None:
    """tmp_path/repo/train.py, and ladder's environment cache inside tmp_path."""
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "cache"))
    (tmp_path / "repo").mkdir()
    (tmp_path / "repo" / "train.py").write_text(train_py)


def test_a_step_flag_the_command_passes_is_templated_without_argparse(tmp_path: Path, monkeypatch) -> None:
    # a dataclass-style config read from sys.argv: no --help, no argparse, no configurator.py (jax-gpt's habit)
    _one_file_repo(tmp_path, monkeypatch,
        "import random, sys\n"
        "cfg = {'max_iters': 5000, 'lr_decay_iters': 5000, 'lr': 0.05}\n"
        "for arg in sys.argv[1:]:\n"
        "    key, value = arg[2:].split('=')\n"
        "    cfg[key] = type(cfg[key])(value)\n"
        "rng, w = random.Random(0), 3.0\n"
        "for it in range(1, cfg['max_iters'] + 1):\n"
        "    x = rng.gauss(1.0, 0.1)\n"
        "    loss = (w - x) ** 2\n"
        "    w -= cfg['lr'] * 2 * (w - x)\n"
        "    if it % 5 == 0:\n"
        "        print(f'iter {it}: loss {loss:.6f}', flush=True)\n"
        "print(f'final val_loss {(w - 1.0) ** 2:.6f}', flush=True)\n")
    p = ladder_cli("init", "--from-run", "python train.py --max_iters=100 --lr_decay_iters=100 --lr=0.05", "--source", "repo",
                   "--python", sys.executable, "--json", cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    spec = load_spec(tmp_path / "ladder.toml")
    # the decay schedule set to the run's length follows it (nanoGPT: "make equal to max_iters usually")
    assert spec.command("short", "reference") == "{python} train.py --max_iters={steps} --lr_decay_iters={steps} --lr=0.05"
    assert any(f["topic"] == "steps" and f["value"] == "--lr_decay_iters = {steps}" for f in json.loads(p.stdout)["findings"])
    assert spec.experiment.short_steps == 100 and spec.probe.seed  # no seed flag anywhere: the probe seeds
    record = execute_run(spec, "reference", "short", seed=0)
    assert record.exit_code == 0 and record.loss_curve[-1].step == 100 and record.metric is not None


def test_only_the_side_without_a_seed_flag_is_seeded_by_the_probe(tmp_path: Path) -> None:
    from ladder.migration.from_run import Side, render_spec
    from ladder.migration.infer import infer_parse

    ref = Side("reference", "{python} train.py --seed {seed} --steps {steps}", sys.executable, "cpu", tmp_path,
               steps=100, wall_s=5.0, exit_code=0)
    tgt = Side("target", "{python} jax_train.py --steps {steps}", sys.executable, "jax-cpu", tmp_path,
               steps=100, wall_s=5.0, exit_code=0, probe_seed=True)
    ref.parse = tgt.parse = infer_parse([f"step {i} loss {1 / i:.4f}" for i in range(1, 30)] + ["final mse 0.1"])
    (tmp_path / "ladder.toml").write_text(render_spec("x", tmp_path, ref, tgt))
    spec = load_spec(tmp_path / "ladder.toml")
    assert not spec.probe.seed and spec.profile("target").probe_seed and spec.profile("reference").probe_seed is None
    ref.probe_seed = True  # neither side has a flag: the shared [probe] seed
    (tmp_path / "ladder.toml").write_text(render_spec("x", tmp_path, ref, tgt))
    spec = load_spec(tmp_path / "ladder.toml")
    assert spec.probe.seed and spec.profile("target").probe_seed is None


def test_a_program_without_a_step_flag_gets_the_length_it_logged(tmp_path: Path, monkeypatch) -> None:
    # no flag sets the length (LucMc's jax_nn.py habit): a guess of 200/2000 steps would be a lie about the run
    _one_file_repo(tmp_path, monkeypatch,
        "import random\n"
        "rng, w = random.Random(0), 3.0\n"
        "for it in range(0, 351):\n"
        "    x = rng.gauss(1.0, 0.1)\n"
        "    w -= 0.05 * 2 * (w - x)\n"
        "    if it % 50 == 0:\n"
        "        print(f'step {it} loss {(w - x) ** 2:.6f}', flush=True)\n"
        "print(f'final mse {(w - 1.0) ** 2:.6f}', flush=True)\n")
    p = ladder_cli("init", "--from-run", "python train.py", "--source", "repo", "--python", sys.executable, "--json",
                   cwd=tmp_path)
    assert p.returncode == 0, p.stderr
    spec = load_spec(tmp_path / "ladder.toml")
    assert (spec.experiment.short_steps, spec.experiment.full_steps) == (350, 350)
    assert "# as logged: no step-count flag" in (tmp_path / "ladder.toml").read_text()
    assert any(f["topic"] == "steps" and f["value"] == "350" and not f["ok"] for f in json.loads(p.stdout)["findings"])


def test_the_logged_length_of_an_epoch_and_batch_log_is_its_global_step() -> None:
    from ladder.migration.from_run import last_logged_step
    from ladder.migration.infer import infer_parse

    lines = [f"Epoch {e}/3 [batch {b}/10] loss: {1 / (e * 10 + b):.4f}" for e in range(1, 4) for b in range(1, 11)]
    lines.append("test accuracy 0.91")
    assert last_logged_step(infer_parse(lines), lines) == 30
