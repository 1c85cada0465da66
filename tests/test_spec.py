"""The spec: every problem reported at once, with key, value and fix; exit code 2 from the CLI."""

from pathlib import Path

import pytest

from helpers import ladder_cli, workspace
from ladder._util.errors import SpecError
from ladder.migration.spec import TEMPLATE, load_spec

BAD = r'''
name = "bad name"
source = "nowhere"
[experiment]
short = "{python} train.py --seed {seed} --lr {lr}"
full = "x"
short_steps = -1
full_steps = 10
expected_minutes_short = 1
expected_minutes_full = 1
[parse]
loss = 'step (\d+) loss (?P<loss>\S+)'
metric = '(?P<value'
direction = "up"
[profiles.reference]
platform = "gpu"
price_per_hour = 1
[probe]
grad_norms = "sometimes"
sample_evry = 10
'''


def test_every_problem_is_reported_at_once(tmp_path: Path) -> None:
    (tmp_path / "ladder.toml").write_text(BAD)
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "ladder.toml")
    keys = {k for k, _, _ in e.value.problems}
    assert {"name", "source", "experiment.short_steps", "parse.loss", "parse.metric", "parse.direction",
            "profiles.reference.platform", "profiles.target", "experiment.short", "probe.grad_norms",
            "probe.sample_evry"} <= keys
    text = str(e.value)
    assert "needs a named group `step`, or `epoch` and `batch`" in text and "'lr'" in text and "nowhere" in text


def test_cli_exits_2_and_prints_all_problems_without_traceback(tmp_path: Path) -> None:
    (tmp_path / "ladder.toml").write_text(BAD)
    p = ladder_cli("run", "--on", "reference", cwd=tmp_path)
    assert p.returncode == 2
    assert "11 problem(s)" in p.stderr and "Traceback" not in p.stderr


def test_protocol_override_errors_are_reported(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace('source = "."', 'source = "."\n[protocol_overrides.l1]\nloss_rel_tol = "loose"\nwindow = 3'))
    with pytest.raises(SpecError) as e:
        load_spec(ws / "ladder.toml")
    keys = {k for k, _, _ in e.value.problems}
    assert keys == {"l1.loss_rel_tol", "l1.window"}


def test_template_written_by_init_is_a_valid_spec_once_source_exists(tmp_path: Path) -> None:
    p = ladder_cli("init", str(tmp_path), cwd=tmp_path)
    assert p.returncode == 0
    assert (tmp_path / "ladder.toml").read_text() == TEMPLATE
    spec = load_spec(tmp_path / "ladder.toml")
    assert spec.profile("target").platform == "xla" and spec.parse.direction == "max"
    again = ladder_cli("init", str(tmp_path), cwd=tmp_path)
    assert again.returncode == 2 and "already exists" in again.stderr
