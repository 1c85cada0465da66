"""Captured runs of real training scripts: success, crash, timeout, NaN, secrets, garbage, huge logs."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from helpers import FIXTURES, cli_json, ladder_cli, set_var, workspace
from ladder.runs.records import RunRecord
from ladder.runs.runner.tree import PIDS_FILE


def _run(ws: Path, *extra: str, env: dict | None = None) -> tuple[dict, RunRecord]:
    summary = cli_json("run", "--on", "reference", *extra, cwd=ws, env=env)
    return summary, RunRecord.load(Path(summary["run_dir"]))


def test_passing_run_records_curve_metric_provenance(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    summary, rec = _run(ws, "--seed", "3")
    assert rec.exit_code == 0 and not rec.timed_out
    assert rec.seed == 3 and "--seed 3" in rec.command and "--steps 200" in rec.command
    assert [p.step for p in rec.loss_curve] == list(range(5, 201, 5))
    assert rec.loss_curve[-1].loss < rec.loss_curve[0].loss  # it really trained
    ts = [p.t for p in rec.loss_curve]
    assert ts == sorted(ts) and 0 < ts[0] < rec.wall_s
    assert rec.metric is not None and 0.5 < rec.metric <= 1.0 and summary["metric"] == rec.metric
    assert rec.evals and rec.evals[-1].items == 512 and rec.evals[-1].values["acc"] == rec.metric
    assert any(p.startswith("torch==") for p in rec.provenance.packages)
    run_dir = Path(summary["run_dir"])
    assert (run_dir / "stdout.log").read_text().splitlines()[0].split("\t")[1].startswith("step 5 loss")
    assert (run_dir / "MANIFEST.sha256").exists()
    # the run executed in its own copy of the code, not in the workspace
    assert Path(rec.cwd) == run_dir / "work" and (run_dir / "work" / "train.py").exists()


def test_git_provenance_commit_and_uncommitted_hash(tmp_path: Path) -> None:
    import git

    ws = workspace(tmp_path)
    repo = git.Repo.init(ws)
    repo.index.add(["train.py", "ladder.toml"])
    repo.index.commit("initial")
    _, clean = _run(ws)
    assert clean.provenance.git_commit == repo.head.commit.hexsha and not clean.provenance.git_dirty
    (ws / "train.py").write_text((ws / "train.py").read_text() + "\n# edited\n")
    _, dirty = _run(ws)
    assert dirty.provenance.git_dirty and len(dirty.provenance.uncommitted_sha256) == 64


def test_crash_is_recorded_with_its_error(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--crash-at 50")
    _, rec = _run(ws)
    assert rec.exit_code == 1 and rec.metric is None
    assert any("simulated crash" in line for line in rec.error_lines)
    assert rec.loss_curve[-1].step == 50


def test_timeout_kills_the_whole_process_group(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--hang-at 10")
    text = (ws / "ladder.toml").read_text().replace('source = "."', 'source = "."\ntimeout_minutes = 0.15')
    (ws / "ladder.toml").write_text(text)
    t0 = time.time()
    _, rec = _run(ws)
    assert rec.timed_out and rec.exit_code is not None and rec.exit_code < 0
    assert time.time() - t0 < 60
    run_dir = Path(rec.cwd).parent
    assert any("child pid" in line for line in (run_dir / "stdout.log").read_text().splitlines())
    # The printed pid is the sandbox's own (a PID namespace): the tree's record holds this machine's pids,
    # each with its kernel start time, so a reused pid is not mistaken for the run's.
    recorded = json.loads((run_dir / PIDS_FILE).read_text())["pids"]
    assert len(recorded) >= 2, recorded  # the training program and the child it spawned, at least
    time.sleep(0.5)
    alive = [(pid, start) for pid, start in recorded if _live_start(pid) == start]
    assert not alive, f"outlived the timeout: {alive}"


def _live_start(pid: int) -> int | None:
    """The kernel start time of a live, non-zombie process (None when gone)."""
    try:
        rest = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except OSError:
        return None
    return None if rest[0] in ("Z", "X") else int(rest[19])


def test_nan_loss_is_seen(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--nan-at 100")
    _, rec = _run(ws)
    assert rec.exit_code == 0
    assert [p.step for p in rec.nonfinite_losses] == [100]


def test_secret_variables_never_reach_the_run(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--print-env ANTHROPIC_API_KEY --steps 10")
    env = {"ANTHROPIC_API_KEY": "sk-ant-secret", "GITHUB_TOKEN": "ghp_x", "AWS_SECRET_ACCESS_KEY": "y",
           "MY_SERVICE_PASSWORD": "z", "HARMLESS": "ok"}
    _, rec = _run(ws, env=env)
    assert "env ANTHROPIC_API_KEY=<absent>" in rec.first_lines
    removed = " ".join(rec.notes)
    for name in ("ANTHROPIC_API_KEY", "GITHUB_TOKEN", "AWS_SECRET_ACCESS_KEY", "MY_SERVICE_PASSWORD"):
        assert name in removed
    assert "HARMLESS" not in removed
    assert "sk-ant-secret" not in (Path(rec.cwd).parent / "run.json").read_text()


def test_pass_env_allowlist_lets_a_variable_through(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--print-env HF_TOKEN --steps 10")
    text = (ws / "ladder.toml").read_text().replace('[profiles.reference]\n', '[profiles.reference]\npass_env = ["HF_TOKEN"]\n')
    (ws / "ladder.toml").write_text(text)
    _, rec = _run(ws, env={"HF_TOKEN": "hf_allowed"})
    assert "env HF_TOKEN=hf_allowed" in rec.first_lines


def test_a_relative_pythonpath_is_the_directory_ladder_was_started_in(tmp_path: Path) -> None:
    # `PYTHONPATH=. ladder run ...` meant the caller's directory; the sandbox must mount it as such (a bare "."
    # handed to bubblewrap failed the run before it started) and the run must find modules there
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--print-env PYTHONPATH --steps 10")
    _, rec = _run(ws, env={"PYTHONPATH": "."})
    assert rec.exit_code == 0, rec.last_lines
    printed = next(line for line in rec.first_lines if line.startswith("env PYTHONPATH="))
    assert str(ws.absolute()) in printed.split("=", 1)[1].split(":"), printed


def test_pattern_that_matches_nothing_shows_the_first_lines(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text().replace("^step (?P<step>", "^STEP (?P<step>")
    (ws / "ladder.toml").write_text(text)
    _, rec = _run(ws)
    assert rec.loss_lines == 0 and any("loss pattern matched no line" in n for n in rec.notes)
    p = ladder_cli("check", str(Path(rec.cwd).parent), "--json", cwd=ws)
    result = json.loads(p.stdout)
    loss_check = next(c for c in result["checks"] if c["name"] == "loss_logged")
    assert loss_check["passed"] is False and "step 5 loss" in loss_check["evidence"]
    assert p.returncode == 1


@pytest.mark.slow
def test_garbage_bytes_and_a_1gb_log_keep_memory_bounded(tmp_path: Path) -> None:
    ws = tmp_path / "noisy"
    ws.mkdir()
    (ws / "noisy_output.py").write_text((FIXTURES / "noisy_output.py").read_text())
    (ws / "ladder.toml").write_text(textwrap.dedent(r'''
        name = "noisy"
        source = "."
        [experiment]
        short = "{python} noisy_output.py 1024"
        full = "{python} noisy_output.py 1024"
        short_steps = 1
        full_steps = 1
        expected_minutes_short = 5
        expected_minutes_full = 5
        [parse]
        loss = '^step (?P<step>\d+) loss (?P<loss>\S+)'
        metric = '^metric acc=(?P<value>\S+)'
        direction = "max"
        [profiles.reference]
        platform = "cpu"
        price_per_hour = 0
        [profiles.target]
        platform = "cpu"
        price_per_hour = 0
    '''))
    probe = textwrap.dedent('''
        import resource, sys
        from ladder.migration.spec import load_spec
        from ladder.runs.execute import execute_run
        rec = execute_run(load_spec("ladder.toml"), "reference", "short", 0)
        print(rec.loss_lines, rec.metric, rec.line_count, resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
    ''')
    out = subprocess.run([sys.executable, "-c", probe], cwd=ws, capture_output=True, text=True, timeout=900)
    assert out.returncode == 0, out.stderr
    loss_lines, metric, line_count, maxrss_kb = out.stdout.split()
    steps = int(Path(next((ws / "runs" / "noisy").iterdir()) / "stderr.log").read_text().split("\t")[1])
    assert int(loss_lines) == steps > 900  # every loss line found among ~1 GB of junk
    assert float(metric) == 0.5  # the last line had no newline
    assert int(line_count) > 256 * steps
    assert int(maxrss_kb) < 400 * 1024, f"ladder used {int(maxrss_kb) // 1024} MB for a 1 GB log"


def test_a_run_without_the_probe_computes_the_same_and_claims_no_device_facts(tmp_path: Path, monkeypatch) -> None:
    """`execute_run(probe=False)` (benchmarks/gpu measures the probe's cost with it) runs the program alone: the
    same loss curve, no probe report, and L2 cannot pass on it."""
    from ladder.checks import CheckContext, run_ladder
    from ladder.migration.spec import load_spec, load_spec_protocol
    from ladder.runs.execute import execute_run

    ws = workspace(tmp_path)
    monkeypatch.chdir(ws)
    spec = load_spec(ws / "ladder.toml")
    probed = execute_run(spec, "reference", "short", 1, run_dir=ws / "runs" / "probed")
    alone = execute_run(spec, "reference", "short", 1, run_dir=ws / "runs" / "alone", probe=False)
    assert probed.exit_code == alone.exit_code == 0
    assert [(p.step, p.loss) for p in alone.loss_curve] == [(p.step, p.loss) for p in probed.loss_curve]
    assert alone.metric == probed.metric
    assert probed.probe is not None and probed.probe["optimizer_steps"] == 200
    assert alone.probe is None and not (ws / "runs" / "alone" / "probe").exists()
    assert any("without the probe" in n for n in alone.notes)
    ctx = CheckContext(run=alone, protocol=load_spec_protocol(spec), baseline=None, expected_platform="cpu")
    l2 = [c for c in run_ladder(ctx, up_to="L2").checks if c.level == "L2"]
    assert l2 and not any(c.status == "passed" for c in l2)
