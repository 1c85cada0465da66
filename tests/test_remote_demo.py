"""The demo with its target profile on the ssh runner, pointed at a real sshd on this machine: it reaches the
same levels, caught by the same checks, as the local demo (tests/test_demo.py). The machine's environment
cache is this machine's ladder cache, so the XLA environment built once for the local tests is reused."""

from __future__ import annotations

from pathlib import Path

import pytest

from ladder.demo import DEMO_SEEDS, prepare_workspace
from ladder.journal.store import Journal
from ladder.runs.envs import cache_root
from ladder.runs.records import RunRecord
from ladder.supervisor.driver import supervise
from sshd import ssh_env, sshd  # noqa: F401 (fixtures)
from test_demo import EXPECTED, assert_levels


@pytest.mark.slow
@pytest.mark.xla
def test_the_demo_on_the_ssh_runner_reaches_the_local_demo_s_levels(tmp_path, xla_python, sshd, ssh_env) -> None:
    ws = prepare_workspace("xla", tmp_path / "demo")
    text = (ws / "ladder.toml").read_text()
    table = f'runner = "ssh"\nssh = {sshd.profile_table(cache=str(cache_root()))}\n'
    (ws / "ladder.toml").write_text(text.replace("[profiles.target]\n", "[profiles.target]\n" + table, 1))
    status = supervise(ws / "ladder.toml", "scripted:migrations/xla.toml", max_attempts=10, seeds=DEMO_SEEDS,
                       full_seeds=1)
    attempts = {a["attempt"]: a for a in status.attempts}
    assert sorted(attempts) == [0, 1, 2, 3], status
    for n, (declared, achieved, caught) in EXPECTED["xla"].items():
        a = attempts[n]
        assert_levels(n, a, declared, achieved)
        assert caught <= set(a["caught_by"]), (n, a["caught_by"])
    assert attempts[3]["full_run"] and status.finished
    with Journal(ws / "journals" / "classifier-xla" / "journal.sqlite") as j:
        runs = [RunRecord.load(ws / e.content["run_dir"]) for e in j.entries("run")]
    # every run of the port ran there: its short and full runs and its parity sides (their tensors came back:
    # attempt 3 passed parity and loaded its exported weights back); the reference's parity side ran here
    port = [r for r in runs if r.profile == "target"]
    assert {r.kind for r in port} >= {"short", "full", "parity"}, [(r.kind, r.profile) for r in runs]
    assert all(r.runner == "ssh" and r.remote.host == sshd.alias for r in port)
    assert all(Path(r.remote.run_dir).is_relative_to(sshd.remote_root) for r in port)
    assert all(r.runner == "local" for r in runs if r.profile == "reference")
