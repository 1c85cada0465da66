"""Progress in words: a real run's lines name the run and carry its real losses; an environment build
shows its phase line and streams its commands' output; a second build waits and says for whom."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import time
from io import StringIO
from pathlib import Path

from helpers import ladder_cli, set_var, workspace
from ladder._progress import Narrator
from ladder.runs.envs import ensure_env, env_key


def test_run_progress_names_the_run_and_prints_its_real_losses(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    set_var(ws, "extra", "--step-sleep 0.01")  # 2 s of steps: several 0.1 s reporting windows, even under load
    p = ladder_cli("run", "--on", "reference", "--seed", "1", "--json", cwd=ws)
    assert p.returncode == 0, p.stderr
    summary = json.loads(p.stdout)  # --json output stays machine output on stdout
    record = json.loads((Path(summary["run_dir"]) / "run.json").read_text())
    recorded = {point["step"]: point["loss"] for point in record["loss_curve"]}
    shown = re.findall(r"^reference short seed 1: step (\d+)/200 loss (\S+) \(", p.stderr, re.M)
    assert len(shown) >= 3, p.stderr
    for step, loss in shown:
        assert float(loss) == float(f"{recorded[int(step)]:.4g}")
    lines = p.stderr.splitlines()
    assert f"reference short seed 1: started (timeout 10m00s); run dir {summary['run_dir']}" in lines
    assert re.search(rf"^reference short seed 1: finished in \S+, exit code 0, acc {summary['metric']:.6g}; "
                     rf"run dir {re.escape(summary['run_dir'])}$", p.stderr, re.M), p.stderr
    assert "exit_code=" not in p.stderr and "run_dir=" not in p.stderr


def _local_package(root: Path) -> Path:
    pkg = root / "hello_pkg"
    (pkg / "hello_pkg").mkdir(parents=True)
    (pkg / "hello_pkg" / "__init__.py").write_text("GREETING = 'hello'\n")
    (pkg / "pyproject.toml").write_text(textwrap.dedent("""\
        [build-system]
        requires = ["setuptools"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "hello-pkg"
        version = "0.1"
    """))
    return pkg


def test_environment_build_shows_its_phase_and_streams_pip(tmp_path: Path) -> None:
    ws = workspace(tmp_path)
    pkg = _local_package(tmp_path)
    setup = ["{python} -m pip install --no-index --no-deps --no-build-isolation --target {env}/site " + str(pkg),
             "echo first streamed line && sleep 0.5 && echo second streamed line",
             "mkdir bin && printf '#!/bin/sh\\nexec %s \"$@\"\\n' {python} > bin/python && chmod +x bin/python"]
    spec = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(spec + f"setup = {json.dumps(setup)}\n")  # the interpreter: {env}/bin/python
    env = {"LADDER_CACHE": str(tmp_path / "cache")}
    env_dir = tmp_path / "cache" / "envs" / env_key(setup)

    p = ladder_cli("run", "--on", "target", cwd=ws, env=env)
    assert p.returncode == 0, p.stderr
    lines = p.stderr.splitlines()
    first = lines.index(f"building the target environment: step 1/3: {setup[0].format(python=sys.executable, env=env_dir)}")
    second = lines.index("building the target environment: step 2/3: " + setup[1])
    installed = lines.index("    Successfully installed hello-pkg-0.1")
    assert first < installed < second < lines.index("    first streamed line") < lines.index("    second streamed line")
    built = [i for i, line in enumerate(lines) if line.startswith("built the target environment in ")]
    assert built and built[0] > second and lines.index(next(ln for ln in lines if ": started (" in ln)) > built[0]
    assert (env_dir / "site" / "hello_pkg" / "__init__.py").exists()

    again = ladder_cli("run", "--on", "target", cwd=ws, env=env)
    assert again.returncode == 0 and "building the target environment" not in again.stderr


def test_a_second_build_says_it_waits_and_for_whom(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "cache"))
    setup = ["sleep 3 && echo built by the first"]
    builder = subprocess.Popen([sys.executable, "-c", "import sys; from ladder.runs.envs import ensure_env; "
                                f"ensure_env({setup!r}, {sys.executable!r})"], env={**os.environ})
    lock = tmp_path / "cache" / "envs" / f"{env_key(setup)}.lock"
    deadline = time.time() + 30
    while not (lock.exists() and lock.read_text()) and time.time() < deadline:
        time.sleep(0.05)
    events: list[tuple[str, dict]] = []
    env = ensure_env(setup, sys.executable, lambda event, data: events.append((event, data)), "target")
    assert builder.wait(timeout=60) == 0
    assert not env.built_now and [e for e, _ in events] == ["env_wait"]
    said = Narrator("test").line(*events[0])
    assert said is not None and said.startswith(f"waiting for process {builder.pid} on ")
    assert said.endswith("to finish building the target environment") and "`-c`" in said


def test_live_view_shows_the_phase_line_and_the_last_output_lines(tmp_path: Path, monkeypatch) -> None:  # noqa: ANN001
    from rich.console import Console

    from ladder._display import Display, set_plain

    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "cache"))
    set_plain(False)
    try:
        d = Display()
    finally:
        set_plain(None)  # type: ignore[arg-type]
    buf = StringIO()
    d.err = Console(file=buf, force_terminal=True, width=200, no_color=True)
    with d.run_progress("test") as cb:
        ensure_env(["echo line one && echo line two && sleep 0.5"], sys.executable, cb, "target")
    out = buf.getvalue()
    assert "building the target environment: step 1/1: echo line one" in out
    assert "line two" in out and "built the target environment in " in out
