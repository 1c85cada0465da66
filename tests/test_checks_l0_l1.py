"""L0 and L1 on real runs, and the trend test on curves with known answers."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from helpers import cli_json, ladder_cli, set_var, workspace
from ladder.checks.compare import trend_test, window_mean
from ladder.migration.protocol import load_protocol
from ladder.runs.records import LossPoint


def _curve(values) -> list[LossPoint]:
    return [LossPoint(step=i + 1, loss=float(v), t=float(i)) for i, v in enumerate(values)]


def _by_name(result: dict) -> dict:
    return {(c["level"], c["name"]): c for c in result["checks"]}


def test_trend_agrees_on_the_same_shape_with_noise() -> None:
    rng = np.random.default_rng(0)
    s = np.arange(200)
    base = 2 * np.exp(-s / 40) + 0.3
    run = base * 1.02 + rng.normal(0, 0.01, 200)
    p = load_protocol().l1
    t = trend_test(_curve(run), _curve(base), p.trend_segments, p.trend_flat_tol, p.trend_near_flat)
    assert t.agree, t.describe()


def test_trend_disagrees_when_the_run_diverges_late() -> None:
    s = np.arange(200)
    base = 2 * np.exp(-s / 40) + 0.3
    run = base.copy()
    run[120:] += np.linspace(0, 0.8, 80)  # loss climbs back up after step 120
    p = load_protocol().l1
    t = trend_test(_curve(run), _curve(base), p.trend_segments, p.trend_flat_tol, p.trend_near_flat)
    assert not t.agree and t.run_classes[-1] == "up" and t.base_classes[-1] != "up"


def test_trend_disagrees_when_the_run_never_learns() -> None:
    s = np.arange(200)
    base = 2 * np.exp(-s / 40) + 0.3
    run = np.full(200, 2.3)
    p = load_protocol().l1
    t = trend_test(_curve(run), _curve(base), p.trend_segments, p.trend_flat_tol, p.trend_near_flat)
    assert not t.agree and t.run_classes[0] == "flat" and t.base_classes[0] == "down"


def test_window_mean_uses_the_last_quarter_of_steps() -> None:
    c = _curve([10.0] * 75 + [2.0] * 25)
    assert math.isclose(window_mean(c, 0.25), 2.0, rel_tol=0.05)


def test_ladder_on_a_faithful_and_a_diverging_port(tmp_path: Path) -> None:
    # The study's fixed rule, chosen in the spec, against one reference seed.
    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace('source = "."', 'source = "."\n[protocol_overrides.l1]\nrule = "fixed"', 1))
    cli_json("baseline", "--short-only", "--seeds", "1", cwd=ws)
    same = cli_json("run", "--on", "target", cwd=ws)
    ok = cli_json("check", same["run_dir"], cwd=ws)
    checks = _by_name(ok)
    assert all(checks[("L0", n)]["passed"] for n in ("finished", "loss_logged", "metric_reported", "finite_loss"))
    assert checks[("L1", "loss_window")]["passed"] and checks[("L1", "metric")]["passed"]
    assert checks[("L1", "trend")]["passed"]
    assert ok["achieved_level"] in ("L1", "L2")
    # no full run was given: L3 and L4 are reported as not checked, never as passed
    assert checks[("L3", "main_result")]["status"] == "not_checked"
    assert checks[("L4", "faster_cheaper")]["status"] == "not_checked"

    # The port smooths its labels: the loss curve shifts by >10%, silently (exit 0, metric printed).
    text = (ws / "ladder.toml").read_text()
    port = tmp_path / "port"
    port.mkdir()
    (port / "train.py").write_text((ws / "train.py").read_text().replace(
        'default=0.0)', 'default=0.01)', 1))
    diverged = cli_json("run", "--on", "target", "--source", str(port), cwd=ws)
    bad = cli_json("check", diverged["run_dir"], cwd=ws)
    lw = _by_name(bad)[("L1", "loss_window")]
    assert lw["passed"] is False and lw["measured"] > 0.10
    assert "relative difference" in lw["evidence"] and "within 5%" in lw["evidence"]
    assert bad["achieved_level"] == "L0"
    assert text == (ws / "ladder.toml").read_text()


def test_a_port_that_reports_its_best_evaluation_fails_the_metric(tmp_path: Path) -> None:
    # The reference evaluates every 20 steps and reports its last evaluation; the port trains the same way and
    # reports its best one (a best-checkpoint habit): the number sits within the seeds' spread, the quantity differs
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--eval-every 20")
    cli_json("baseline", "--seeds", "3", "--short-only", cwd=ws)
    good = cli_json("run", "--on", "target", "--seed", "3", cwd=ws)
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace('extra = "--eval-every 20"', 'extra = "--eval-every 20 --report best"'))
    best = cli_json("run", "--on", "target", "--seed", "3", cwd=ws)
    from ladder.runs.records import RunRecord

    run = RunRecord.load(Path(best["run_dir"]))
    last, top = run.evals[-1].values["acc"], max(e.values["acc"] for e in run.evals)
    assert top > last and run.metric == top, (last, top, run.metric)  # the fault really happens at this seed
    metric = _by_name(cli_json("check", good["run_dir"], cwd=ws, ok_codes=(0, 1)))[("L1", "metric")]
    assert metric["status"] != "failed", metric["evidence"]
    assert "reported" not in (metric.get("details") or {}), metric["details"]
    metric = _by_name(cli_json("check", best["run_dir"], cwd=ws, ok_codes=(0, 1)))[("L1", "metric")]
    assert metric["status"] == "failed", metric["evidence"]
    assert metric["evidence"].startswith(f"the run's acc {top:.6g} is its best evaluation"), metric["evidence"]
    assert "every baseline run of this kind reports last evaluation" in metric["evidence"], metric["evidence"]


def test_a_running_mean_logged_for_each_steps_loss_fails_the_trend(tmp_path: Path) -> None:
    # The port trains as the reference does and logs the mean of the last 20 steps' losses where the reference logs
    # each step's: a curve that looks right (its late mean is close), and another quantity
    ws = workspace(tmp_path)
    cli_json("baseline", "--seeds", "3", "--short-only", cwd=ws)
    good = cli_json("run", "--on", "target", "--seed", "3", cwd=ws)
    set_var(ws, "extra", "--log-mean 20")
    smooth = cli_json("run", "--on", "target", "--seed", "3", cwd=ws)
    assert smooth["metric"] == good["metric"]  # the same training: only the log differs
    trend = _by_name(cli_json("check", good["run_dir"], cwd=ws, ok_codes=(0, 1)))[("L1", "trend")]
    assert "logged_noise" not in (trend.get("details") or {}) and trend["status"] != "failed", trend["evidence"]
    trend = _by_name(cli_json("check", smooth["run_dir"], cwd=ws, ok_codes=(0, 1)))[("L1", "trend")]
    assert trend["status"] == "failed", trend["evidence"]
    assert trend["evidence"].startswith("the logged loss's step-to-step noise is 0."), trend["evidence"]
    assert "smoother" in trend["evidence"] and trend["details"]["logged_noise"]["ratio"] < 0.25, trend["details"]


def test_crash_and_nan_fail_l0(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace('extra = ""', 'extra = "--nan-at 60"'))
    run = cli_json("run", "--on", "target", cwd=ws)
    p = ladder_cli("check", run["run_dir"], "--json", cwd=ws)
    import json

    res = json.loads(p.stdout)
    finite = _by_name(res)[("L0", "finite_loss")]
    assert p.returncode == 1 and res["achieved_level"] is None
    assert finite["passed"] is False and "step 60" in finite["evidence"]


@pytest.mark.slow
def test_real_gradient_fault_that_adam_hides_is_caught_by_the_gradient_norm_curve(tmp_path: Path) -> None:
    """Losses multiplied by 4 before backward (micro-batch losses summed, not averaged): Adam divides the
    scale away, so the loss and the metric are the faithful run's; only the gradient norms show it."""
    from ladder.journal.notes import diagnose
    from ladder.runs.records import RunRecord
    from ladder.checks.results import CheckResult

    ws = workspace(tmp_path)
    set_var(ws, "extra", "--opt adam")
    # every step's norms kept: the 2% budget thins them by the machine's load (k = 8 on an idle machine, more on a
    # busy CI one), and a band from 3 seeds sampled at every 16th step is too wide for a 4x gradient to leave it
    with (ws / "ladder.toml").open("a") as f:
        f.write("\n[probe]\ngrad_norm_budget = 1.0\n")
    cli_json("baseline", "--seeds", "3", "--short-only", cwd=ws)
    good = cli_json("run", "--on", "target", "--seed", "7", cwd=ws)
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace('extra = "--opt adam"', 'extra = "--opt adam --grad-scale 4"'))
    bad = cli_json("run", "--on", "target", "--seed", "7", cwd=ws)
    assert bad["metric"] == good["metric"]  # the fault really is invisible in the metric

    faithful = _by_name(cli_json("check", good["run_dir"], cwd=ws, ok_codes=(0, 1)))
    assert faithful[("L1", "trend")]["details"]["calibrated"]["details"]["grad_norm"]["passed"] is True
    assert faithful[("L1", "trend")]["status"] in ("passed", "undecided")

    faulty = _by_name(cli_json("check", bad["run_dir"], cwd=ws, ok_codes=(0, 1)))
    trend = faulty[("L1", "trend")]
    assert trend["status"] == "failed", trend["evidence"]
    cal = trend["details"]["calibrated"]
    assert cal["details"]["grad_norm"]["passed"] is False
    assert not any(b["status"] == "failed" for b in cal["band"]["blocks"])  # the loss curve is within noise
    assert faulty[("L1", "loss_window")]["status"] != "failed"
    note = diagnose(CheckResult.model_validate(trend), RunRecord.load(Path(bad["run_dir"])))
    assert "gradient the optimizer receives is larger by" in note, note


def test_third_party_checks_register_through_an_entry_point(tmp_path: Path) -> None:
    """A distribution on the path that declares `ladder.checks` entry points: its check joins the ladder, and a
    plugin that fails to load shows up as a failed check rather than vanishing."""
    import subprocess
    import sys
    import textwrap

    site = tmp_path / "site"
    (site / "myplug-0.1.dist-info").mkdir(parents=True)
    (site / "myplug-0.1.dist-info" / "METADATA").write_text("Metadata-Version: 2.1\nName: myplug\nVersion: 0.1\n")
    (site / "myplug-0.1.dist-info" / "entry_points.txt").write_text(
        "[ladder.checks]\nlicense = myplug_checks\nbroken = myplug_broken\n")
    (site / "myplug_checks.py").write_text(textwrap.dedent('''
        from ladder.checks import register
        from ladder.checks.results import CheckResult

        @register("L2", "license_headers")
        def license_headers(ctx):
            return CheckResult(level="L2", name="license_headers", status="passed", evidence="all files carry one")
    '''))
    (site / "myplug_broken.py").write_text("raise RuntimeError('no such thing')\n")
    code = textwrap.dedent('''
        from ladder.checks import CheckContext, registered, run_ladder
        from ladder.migration.protocol import load_protocol
        from ladder.runs.records import Provenance, RunRecord
        print(registered()["L2"])
        run = RunRecord(run_id="r", kind="short", profile="p", platform="cpu", seed=0, command="x", cwd=".",
                        started_at=0.0, ended_at=1.0, exit_code=0, timeout_s=1, provenance=Provenance(source="."))
        res = run_ladder(CheckContext(run=run, protocol=load_protocol()), up_to="L2")
        print([(c.name, c.status) for c in res.checks if c.name.startswith(("plugin", "license"))])
    ''')
    import os

    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                       env={**os.environ, "PYTHONPATH": str(site)})
    assert p.returncode == 0, p.stderr
    names, results = p.stdout.splitlines()
    assert "license_headers" in names
    assert "('license_headers', 'passed')" in results and "('plugin:broken', 'failed')" in results
