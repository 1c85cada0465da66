"""ladder as a normal install: the wheel holds every package and its data, and works outside the source tree.

The wheel test builds the wheel from a copy of the sources, installs it (without its dependencies) into a
fresh virtual environment that borrows this environment's installed dependencies through a path file, and
runs the console script from an empty directory: `ladder init --from-run` on a standard-library program,
a baseline, a run and `ladder check`. Undeclared dependencies are caught by scanning the installed
package's imports against the wheel's Requires-Dist.
"""

from __future__ import annotations

import ast
import importlib.metadata as md
import json
import os
import re
import shutil
import subprocess
import sys
import sysconfig
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
# Imported only inside a run's own interpreter (the probe), or only where present
RUN_SIDE = {"torch", "torch_xla", "jax", "jaxlib", "flax", "optax", "sitecustomize", "_ladder_probe"}
OPTIONAL = {"click", "sky"}  # click: imported under `except ImportError` (typer vendors its own copy); sky: the
# skypilot extra (ladder[skypilot]), imported only by the skypilot runner after checking it is installed

PROGRAM = '''import argparse, random
p = argparse.ArgumentParser()
p.add_argument("--seed", type=int, default=0)
p.add_argument("--steps", type=int, default=60)
a = p.parse_args()
rng = random.Random(a.seed)
w = rng.uniform(2, 3)
for step in range(1, a.steps + 1):
    x = rng.gauss(0.5, 0.3)
    loss = (w - x) ** 2
    w -= 0.05 * 2 * (w - x)
    if step % 2 == 0:
        print(f"step {step} | loss {loss:.5f}", flush=True)
print(f"final error: {abs(w - 0.5):.5f}")
'''


def test_pyproject_lists_every_package_and_its_data() -> None:
    config = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    found = {".".join(p.parent.relative_to(REPO).parts) for p in (REPO / "ladder").rglob("__init__.py")
             if "_ladder_probe" not in p.parts}
    assert found | {"ladder.protocols"} == set(config["packages"])
    assert config["package-dir"] == {"ladder.protocols": "protocols"}


def test_the_typer_pin_is_the_range_whose_usage_errors_the_cli_handles() -> None:
    from typer._click.exceptions import ClickException

    from ladder._cli.main import _usage_errors

    pin = next(d for d in tomllib.loads((REPO / "pyproject.toml").read_text())["project"]["dependencies"]
               if d.startswith("typer"))
    low, high = re.findall(r"[\d.]+", pin)
    version = tuple(int(x) for x in md.version("typer").split(".")[:2])
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split(".")))
    assert ClickException in _usage_errors()


def _build_wheel(tmp: Path) -> Path:
    src = tmp / "src"  # a copy: building in the repository would leave build/ and *.egg-info there
    src.mkdir()
    for name in ("pyproject.toml", "README.md"):
        shutil.copy2(REPO / name, src / name)
    for name in ("ladder", "protocols"):
        shutil.copytree(REPO / name, src / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    isolation = []
    try:
        import setuptools

        if int(setuptools.__version__.split(".")[0]) >= 68:
            isolation = ["--no-build-isolation"]  # offline and faster; the build backend is here already
    except ImportError:
        pass
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", str(tmp / "dist"),
                    str(src)], check=True, capture_output=True, text=True)
    return next((tmp / "dist").glob("ladder-*.whl"))


def _fresh_venv(tmp: Path, wheel: Path) -> Path:
    venv = tmp / "venv"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(venv)], check=True)
    py = venv / "bin" / "python"
    site = Path(subprocess.run([str(py), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                               capture_output=True, text=True, check=True).stdout.strip())
    # The dependencies come from this environment (a plain path entry: its editable ladder is not loaded).
    (site / "_test_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    subprocess.run([sys.executable, "-m", "pip", "--python", str(py), "install", "-q", "--no-deps", "--no-index",
                    str(wheel)], check=True, capture_output=True, text=True)
    return venv


def _undeclared_imports(venv: Path) -> set[str]:
    py = venv / "bin" / "python"
    # What the wheel declares, and what those declare in turn (what an install of the wheel brings)
    code = ("import importlib.metadata as md, json, ladder, pathlib, re\n"
            "norm = lambda r: re.split(r'[ ;<>=!~\\[(]', r, maxsplit=1)[0].lower().replace('_', '-')\n"
            "todo, seen = [norm(r) for r in md.requires('ladder') if 'extra ==' not in r], set()\n"
            "while todo:\n"
            "    d = todo.pop()\n"
            "    if d in seen: continue\n"
            "    seen.add(d)\n"
            "    try: todo += [norm(r) for r in md.requires(d) or [] if 'extra ==' not in r]\n"
            "    except md.PackageNotFoundError: pass\n"
            "print(json.dumps({'root': str(pathlib.Path(ladder.__file__).parent), 'declared': sorted(seen), "
            "'dists': md.packages_distributions()}))")
    info = json.loads(subprocess.run([str(py), "-c", code], capture_output=True, text=True, check=True).stdout)
    declared = set(info["declared"])
    missing = set()
    for path in Path(info["root"]).rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else \
                [node.module] if isinstance(node, ast.ImportFrom) and node.module and not node.level else []
            for name in names:
                top = name.split(".")[0]
                if top in sys.stdlib_module_names or top == "ladder" or top in RUN_SIDE | OPTIONAL:
                    continue
                dists = {d.lower().replace("_", "-") for d in info["dists"].get(top, [top])}
                if not dists & declared:
                    missing.add(f"{top} ({path.name})")
    return missing


@pytest.mark.slow
def test_the_wheel_installs_and_runs_outside_the_source_tree(tmp_path: Path) -> None:
    venv = _fresh_venv(tmp_path, _build_wheel(tmp_path))
    assert _undeclared_imports(venv) == set()
    py, ladder = venv / "bin" / "python", venv / "bin" / "ladder"
    where = subprocess.run([str(py), "-c", "import ladder, ladder.migration.protocol as p; print(ladder.__file__); "
                            "print(p.PROTOCOLS_DIR); print(p.load_protocol('ncsu').name)"], capture_output=True,
                           text=True, check=True, cwd=tmp_path).stdout.split()
    assert all(w.startswith(str(venv)) for w in where[:2]) and where[2] == "ncsu", where
    assert (Path(where[1]) / "prompts" / "system.md").is_file()

    work = tmp_path / "work"
    (work / "repo").mkdir(parents=True)
    (work / "repo" / "train.py").write_text(PROGRAM)
    env = {**os.environ, "LADDER_PLAIN": "1", "LADDER_CACHE": str(tmp_path / "cache")}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([str(ladder), *args], cwd=work, env=env, capture_output=True, text=True, timeout=600)

    p = cli("init", "--from-run", "python train.py --seed 0 --steps 60", "--source", "repo", "--python", str(py),
            "--yes")
    assert p.returncode == 0, p.stderr
    assert cli("baseline", "--seeds", "3", "--short-only").returncode == 0
    p = cli("run", "--on", "target", "--seed", "7", "--json")
    assert p.returncode == 0, p.stderr
    run = json.loads(p.stdout)
    assert run["loss_lines"] == 30 and run["metric_name"] == "final_error"
    p = cli("check", run["run_dir"], "--require", "L1", "--json")
    assert p.returncode == 0, p.stdout + p.stderr
    assert json.loads(p.stdout)["achieved_level"] in ("L1", "L2")
    p = cli("run", "--on", "nowhere")
    assert p.returncode == 2 and "Traceback" not in p.stderr  # a user's error, not a crash


def test_every_option_of_every_command_has_help_and_flags_show_cleanly() -> None:
    import typer.main

    from ladder._cli.main import _register, app

    _register()
    root = typer.main.get_command(app)
    seen, missing, helps = 0, [], []

    def walk(cmd, path: list[str], parent=None) -> None:
        nonlocal seen
        ctx = type(root).context_class(cmd, info_name=path[-1], parent=parent)
        helps.append(cmd.get_help(ctx))
        for p in cmd.params:
            seen += 1
            if not getattr(p, "help", None) and p.name != "help":
                missing.append(f"{' '.join(path)} {'/'.join(p.opts)}")
        for name, sub in getattr(cmd, "commands", {}).items():
            walk(sub, path + [name], ctx)

    walk(root, ["ladder"])
    assert seen > 80 and missing == []
    assert not any("<bool>" in h or "--no-" in h for h in helps)
