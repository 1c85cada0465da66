"""Baselines: stored once, immutable, and any later edit, deletion or addition is caught."""

from __future__ import annotations

import json
from pathlib import Path

from helpers import cli_json, ladder_cli, workspace
from ladder.baselines.store import Baseline


def test_baseline_store_refuse_force_and_verify(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    out = cli_json("baseline", "--seeds", "2", "--short-only", cwd=ws)
    root = Path(out["baseline"])
    assert root == ws / "baselines" / "tiny" / "v1"
    b = Baseline.load(root)
    assert [r.seed for r in b.short_runs] == [0, 1] and b.full_runs == []
    assert all(r.metric is not None and r.exit_code == 0 for r in b.short_runs)
    assert not (root / "short-s0" / "work").exists()  # the code is identified by its commit, not copied

    again = ladder_cli("baseline", "--short-only", cwd=ws)
    assert again.returncode == 2 and "immutable" in again.stderr

    ok = cli_json("baseline", "verify", cwd=ws)
    assert ok["ok"] is True

    # edit one byte of a stored loss value
    run_json = root / "short-s1" / "run.json"
    data = json.loads(run_json.read_text())
    data["loss_curve"][3]["loss"] += 0.001
    run_json.write_text(json.dumps(data, indent=1))
    (root / "short-s0" / "stderr.log").unlink()
    (root / "extra.txt").write_text("planted")
    bad = ladder_cli("baseline", "verify", "--json", cwd=ws)
    assert bad.returncode == 1
    problems = json.loads(bad.stdout)["baselines"][str(root)]
    assert "edited: short-s1/run.json" in problems
    assert "missing: short-s0/stderr.log" in problems
    assert "added: extra.txt" in problems

    # checking against a tampered baseline is refused
    forced = cli_json("baseline", "--short-only", "--force", cwd=ws)
    assert Path(forced["baseline"]).name == "v2"
    run = cli_json("run", "--on", "target", cwd=ws)
    refused = ladder_cli("check", run["run_dir"], "--baseline", str(root), cwd=ws)
    assert refused.returncode == 1 and "modified after it was stored" in refused.stderr


def test_failed_reference_run_stores_nothing(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text().replace('extra = ""', 'extra = "--crash-at 20"')
    (ws / "ladder.toml").write_text(text)
    p = ladder_cli("baseline", "--short-only", cwd=ws)
    assert p.returncode == 2 and "baseline was not stored" in p.stderr and "simulated crash" in p.stderr
    assert not (ws / "baselines" / "tiny" / "v1").exists()
