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


def test_identical_runs_give_no_noise_estimate_until_the_probe_seeds_them(tmp_path: Path) -> None:
    """A program that seeds itself from a constant, run without {seed}: its baseline runs come out bit-identical.
    ladder says so when storing it, and the calibrated checks say not_checked, never a band of the floor."""
    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text().replace("--seed {seed} ", "")
    (ws / "ladder.toml").write_text(text)
    p = ladder_cli("baseline", "--seeds", "3", "--short-only", "--json", cwd=ws)
    assert p.returncode == 0, p.stderr
    assert json.loads(p.stdout)["identical_runs"] is True and "no noise estimate" in p.stderr
    run = cli_json("run", "--on", "target", "--seed", "5", cwd=ws)
    checks = {c["name"]: c for c in cli_json("check", run["run_dir"], cwd=ws, ok_codes=(0, 1))["checks"]}
    for name in ("loss_window", "metric", "trend"):
        assert checks[name]["status"] == "not_checked" and "identical" in checks[name]["evidence"], checks[name]

    (ws / "ladder.toml").write_text(text + "\n[probe]\nseed = true\n")
    seeded = cli_json("baseline", "--seeds", "3", "--short-only", "--force", cwd=ws)
    assert seeded["identical_runs"] is False
    b = Baseline.load(Path(seeded["baseline"]))
    assert len({tuple(p.loss for p in r.loss_curve) for r in b.short_runs}) == 3


def test_extend_adds_runs_and_keeps_every_earlier_digest_provable(tmp_path: Path) -> None:
    from ladder.baselines.store import manifest_chain, verify_baseline
    from ladder.journal import entries as je
    from ladder.journal.store import Journal, verify_journal

    ws = workspace(tmp_path)
    first = cli_json("baseline", "--seeds", "2", "--short-only", cwd=ws)
    root = Path(first["baseline"])
    journal = ws / "journals" / "tiny" / "journal.sqlite"
    with Journal(journal) as j:
        pin = je.append_baseline(j, root, root=ws)  # the migration pinned the 2-seed version
    extended = cli_json("baseline", "extend", "--seeds", "4", cwd=ws)
    assert extended["baseline"] == str(root) and [r["seed"] for r in extended["runs"]] == [0, 1, 2, 3]
    assert Baseline.load(root).meta.extensions[0]["added"] == ["short-s2", "short-s3"]
    chain = manifest_chain(root)
    assert chain[0] == pin.content["digest"] and chain[-1] != chain[0]
    assert verify_baseline(root) == [] and verify_journal(journal, ws).ok  # the old pin still verifies
    # history is evidence too: rewriting what the earlier manifest said is caught
    old = root / "history" / "MANIFEST.1.sha256"
    old.write_text(old.read_text().replace("short-s1/run.json", "short-s1/run.jsonX"))
    assert verify_baseline(root) and not verify_journal(journal, ws).ok
