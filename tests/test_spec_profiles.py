"""Per-profile commands, working directories and log patterns; the warnings a spec load gives."""

from __future__ import annotations

import warnings
from pathlib import Path

import pytest

from helpers import ladder_cli, workspace
from ladder._util.errors import SpecError
from ladder.migration.spec import TEMPLATE, SpecWarning, load_spec


def _load_quiet(path: Path):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", SpecWarning)
        return load_spec(path)


def test_each_side_has_its_own_command_cwd_and_patterns(tmp_path: Path) -> None:
    spec = _load_quiet(workspace(tmp_path, "twosided") / "ladder.toml")
    assert spec.command("short", "reference") == "{python} train.py --seed {seed} --steps {steps}"
    assert spec.command("short", "target").startswith("{python} main.py --random-seed {seed}")
    assert spec.profile("target").cwd == "src" and spec.profile("reference").cwd == "."
    ref, tgt = spec.parse_for("reference"), spec.parse_for("target")
    assert ref == spec.parse
    assert tgt.loss.startswith(r"^\|") and tgt.metric.startswith("^final")
    assert tgt.metric_name == "mse" and tgt.direction == "min" and tgt.error == spec.parse.error


def test_a_profile_may_switch_off_the_shared_eval_pattern(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "twosided")
    text = (ws / "ladder.toml").read_text()
    text = text.replace('direction = "min"', 'direction = "min"\neval = \'^eval (?P<step>\\d+)\'')
    (ws / "ladder.toml").write_text(text + "eval = ''\n")
    spec = _load_quiet(ws / "ladder.toml")
    assert spec.parse_for("reference").eval == r"^eval (?P<step>\d+)" and spec.parse_for("target").eval is None


BAD_PROFILES = r'''
name = "bad"
source = "."
[experiment]
full = "{python} train.py --seed {seed}"
short_steps = 10
full_steps = 10
expected_minutes_short = 1
expected_minutes_full = 1
[parse]
loss = 'step (?P<step>\d+) loss (?P<loss>[-+.\w]+)'
metric = 'acc (?P<value>[-+.\w]+)'
direction = "max"
[profiles.reference]
platform = "cpu"
price_per_hour = 1
cwd = "../elsewhere"
prepare = ["{python} prep.py --seed {seed}"]
[profiles.target]
platform = "cpu"
price_per_hour = 1
short = "{python} main.py --rng {seed} --data {prepared} --lr {lr}"
comand = "typo"
[profiles.target.parse]
loss = 'step (\d+)'
direction = "min"
metric = '(?P<value'
'''


def test_every_profile_problem_is_reported_at_its_own_key(tmp_path: Path) -> None:
    (tmp_path / "ladder.toml").write_text(BAD_PROFILES)
    with pytest.raises(SpecError) as e:
        load_spec(tmp_path / "ladder.toml")
    problems = {k: fix for k, _, fix in e.value.problems}
    assert {"profiles.reference.cwd", "profiles.reference.prepare.0", "profiles.reference.short",
            "profiles.target.short", "profiles.target.comand", "profiles.target.parse.loss",
            "profiles.target.parse.direction", "profiles.target.parse.metric"} <= set(problems)
    assert "no short command for this profile" in problems["profiles.reference.short"]
    assert "'lr'" in problems["profiles.target.short"] and "{prepared} needs a `prepare` step" in \
        problems["profiles.target.short"]
    assert "'seed'" in problems["profiles.reference.prepare.0"]
    assert "belong to the experiment" in problems["profiles.target.parse.direction"]
    assert "not above the source" in problems["profiles.reference.cwd"]


def test_spec_warnings_name_the_key_and_the_fix(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "tiny")
    text = (ws / "ladder.toml").read_text()
    text = text.replace("--seed {seed} ", "", 1)  # the short command loses its seed
    text = text.replace(r"(?P<value>[-+.\w]+)", r"(?P<value>\S+)")
    text = text.replace('env = { OMP_NUM_THREADS = "1" }\n\n[profiles.target]', "\n[profiles.target]")
    (ws / "ladder.toml").write_text(text)
    with pytest.warns(SpecWarning) as caught:
        spec = load_spec(ws / "ladder.toml")
    keys = {k for k, _, _ in spec.warnings}
    assert keys == {"experiment.short", "profiles.reference.env", "parse.metric"}
    messages = " ".join(str(w.message) for w in caught)
    assert "[probe] seed = true" in messages and "OMP_NUM_THREADS" in messages and "'1.5;'" in messages
    text += "\n[probe]\nseed = true\n"
    (ws / "ladder.toml").write_text(text)
    assert "experiment.short" not in {k for k, _, _ in _load_quiet(ws / "ladder.toml").warnings}


def test_the_template_and_the_examples_load_without_warnings(tmp_path: Path) -> None:
    (tmp_path / "ladder.toml").write_text(TEMPLATE)
    examples = Path(__file__).resolve().parent.parent / "examples"
    for path in [tmp_path / "ladder.toml", *sorted(examples.glob("*/ladder*.toml"))]:
        with warnings.catch_warnings():
            warnings.simplefilter("error", SpecWarning)
            assert load_spec(path).warnings == [], path


def test_cli_prints_warnings_once_and_goes_on(tmp_path: Path) -> None:
    ws = workspace(tmp_path, "tiny")
    text = (ws / "ladder.toml").read_text().replace(r"loss (?P<loss>[-+.\w]+)", r"loss (?P<loss>.+)")
    (ws / "ladder.toml").write_text(text)
    p = ladder_cli("run", "--on", "reference", "--json", cwd=ws)
    assert p.returncode == 0, p.stderr
    lines = [x for x in p.stderr.splitlines() if x.startswith("warning:")]
    assert len(lines) == 1 and "parse.loss" in lines[0] and "Traceback" not in p.stderr


def test_one_side_seeds_by_the_probe_while_the_other_takes_its_flag(tmp_path: Path) -> None:
    """The reference passes --seed; the port's command has no seed flag (its program seeds from a constant):
    probe_seed = true on the port's profile alone makes its seeds differ, and leaves the reference's flag alone."""
    from ladder.migration.spec import spec_warnings
    from ladder.runs.execute import execute_run

    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text()
    port = '[profiles.target]\nshort = "{python} train.py --steps {steps}"\n'
    (ws / "ladder.toml").write_text(text.replace("[profiles.target]\n", port, 1))
    spec = _load_quiet(ws / "ladder.toml")
    assert any(key == "profiles.target.short" for key, *_ in spec_warnings(spec))  # every seed the same program

    def curve(spec, profile: str, seed: int) -> list[float]:
        return [p.loss for p in execute_run(spec, profile, "short", seed=seed).loss_curve]

    assert curve(spec, "target", 1) == curve(spec, "target", 2)  # without the probe's seeding: identical
    (ws / "ladder.toml").write_text(text.replace("[profiles.target]\n", port + "probe_seed = true\n", 1))
    spec = _load_quiet(ws / "ladder.toml")
    assert not any(key == "profiles.target.short" for key, *_ in spec_warnings(spec))
    assert spec.probe_options(spec.profile("target")).seed and not spec.probe_options(spec.profile("reference")).seed
    assert curve(spec, "target", 1) != curve(spec, "target", 2)
    # the reference's flag alone decides its seed: its seed 1 is the program's own --seed 1, run without ladder
    import subprocess
    import sys

    bare = subprocess.run([sys.executable, "train.py", "--seed", "1", "--steps", "200"], cwd=ws, capture_output=True,
                          text=True, env={"OMP_NUM_THREADS": "1", "PATH": "/usr/bin:/bin"}, check=True).stdout
    losses = [float(line.split()[3]) for line in bare.splitlines() if line.startswith("step ")]
    assert curve(spec, "reference", 1) == pytest.approx(losses, abs=1e-6)


def test_commands_take_integer_arithmetic_on_a_placeholder(tmp_path: Path) -> None:
    """A port that must be told steps + 1 (or half the steps) says so in its command: {steps+1}, {steps//2}."""
    from ladder._util.errors import LadderError
    from ladder.runs.execute import execute_run

    ws = workspace(tmp_path)
    text = (ws / "ladder.toml").read_text()
    port = '[profiles.target]\nshort = "{python} train.py --seed {seed} --steps {steps//2} {extra}"\n'
    (ws / "ladder.toml").write_text(text.replace("[profiles.target]\n", port, 1))
    spec = _load_quiet(ws / "ladder.toml")
    record = execute_run(spec, "target", "short", seed=0)
    assert "--steps 100 " in record.command + " " and record.loss_curve[-1].step == 100
    # a name that does not exist is reported as any unknown placeholder; a non-integer var fails the fill
    (ws / "ladder.toml").write_text(text.replace("[profiles.target]\n", port.replace("{steps//2}", "{stepz+1}"), 1))
    with pytest.raises(SpecError) as e:
        load_spec(ws / "ladder.toml")
    assert "['stepz']" in str(e.value)
    (ws / "ladder.toml").write_text(text.replace("[profiles.target]\n", port.replace("{steps//2}", "{extra+1}"), 1))
    with pytest.raises(LadderError, match="extra is '', not an integer"):
        execute_run(_load_quiet(ws / "ladder.toml"), "target", "short", seed=0)
