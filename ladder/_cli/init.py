"""`ladder init [DIR]`: write a commented ladder.toml, from a template or (--from-run) from a real run."""

from __future__ import annotations

import sys
import warnings
from pathlib import Path

import typer

from ladder._cli.main import app
from ladder._display import display
from ladder._util.errors import LadderError
from ladder.migration.spec import TEMPLATE


@app.command()
def init(
    directory: Path = typer.Argument(Path("."), help="Where to write ladder.toml."),
    force: bool = typer.Option(False, "--force", help="Overwrite an existing ladder.toml; with --from-run, also "
                               "write the proposal when a side's run failed."),
    from_run: str | None = typer.Option(None, "--from-run", metavar="COMMAND", help="The reference's training "
                                        "command, short (a few hundred steps): ladder runs it once and proposes the "
                                        "spec from what it prints."),
    source: Path = typer.Option(Path("."), "--source", help="The reference repo (the command runs in a copy)."),
    python: str | None = typer.Option(None, "--python", help="The reference's interpreter (default: the one the "
                                      "command names, on PATH)."),
    platform: str = typer.Option("cpu", "--platform", help="The reference's platform (cpu, cuda, xla, jax-cpu, ...)."),
    prepare: list[str] = typer.Option([], "--prepare", metavar="COMMAND", help="A data preparation command of the "
                                      "reference, run once before it (repeat for more)."),
    target_run: str | None = typer.Option(None, "--target-run", metavar="COMMAND", help="The port's command, run "
                                          "and read the same way (default: with ANTHROPIC_API_KEY set, Claude "
                                          "proposes one from the port's README)."),
    target_source: Path | None = typer.Option(None, "--target-source", help="The port's repo, when it is not the "
                                              "reference's."),
    target_python: str | None = typer.Option(None, "--target-python", help="The port's interpreter."),
    target_platform: str | None = typer.Option(None, "--target-platform", help="The port's platform (default: from "
                                               "what its code imports)."),
    target_prepare: list[str] = typer.Option([], "--target-prepare", metavar="COMMAND", help="A data preparation "
                                             "command of the port (repeat for more)."),
    name: str | None = typer.Option(None, "--name", help="The migration's name (default: <source dir>-port)."),
    timeout: float = typer.Option(300.0, "--timeout", help="Seconds each observed run may take."),
    yes: bool = typer.Option(False, "--yes", "-y", help="Write the proposed spec without asking."),
    as_json: bool = typer.Option(False, "--json", help="Print the findings and the path written as JSON."),
) -> int:
    """Write a commented ladder.toml: a template to fill in, or (--from-run) one inferred from a real run."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "ladder.toml"
    if target.exists() and not force:
        raise LadderError(f"{target} already exists", "edit it, or pass --force to overwrite it")
    if from_run is None:
        if target_run or target_source or prepare or target_prepare:
            raise LadderError("--target-run, --target-source and --prepare need --from-run",
                              'pass --from-run "python train.py ..." (the reference\'s command)')
        target.write_text(TEMPLATE)
        display().info(f"wrote {target}: fill in source, commands, [parse] patterns and the two profiles")
        return 0
    return _from_run(target, from_run, source, python, platform, prepare, target_run, target_source, target_python,
                     target_platform, target_prepare, name, timeout, yes, as_json, force)


def _from_run(target: Path, command: str, source: Path, python: str | None, platform: str, prepare: list[str],
              target_run: str | None, target_source: Path | None, target_python: str | None,
              target_platform: str | None, target_prepare: list[str], name: str | None, timeout: float, yes: bool,
              as_json: bool, force: bool = False) -> int:
    from ladder.migration.from_run import propose
    from ladder.migration.spec import SpecWarning, load_spec

    d = display()
    with d.run_progress("init") as cb:
        proposal = propose(command, source, target.parent, python=python, platform=platform, prepare=prepare,
                           target_command=target_run, target_source=target_source, target_python=target_python,
                           target_platform=target_platform, target_prepare=target_prepare, name=name,
                           timeout_s=timeout, progress=lambda side, event, data: cb(event, data))
    draft = (target.parent / ".ladder.toml.proposed").resolve()
    draft.write_text(proposal.text)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always", SpecWarning)
        load_spec(draft)  # the proposal must be a valid spec; a problem here is a bug in the inference
    rows = [[side, "yes" if f.ok else "NO", f.topic, f.value, f.why] for side, f in proposal.findings]
    failed = [s for s in (proposal.reference, proposal.target) if s is not None and s.failed]
    # a side whose run failed gave no ground for its log format: the proposal is kept as a draft unless forced
    write = (yes or as_json or not sys.stdin.isatty()) and (force or not failed)
    if not as_json:
        d.table(f"inferred from the run (draft: {draft})", ["side", "ok", "what", "value", "why"], rows)
        for w in caught:
            d.info(f"warning: {w.message}")
        if not write and not failed:
            write = typer.confirm(f"write {target}?", default=True)
    if write:
        draft.replace(target)
    if as_json:
        d.json({"spec": str(target) if write else None, "draft": None if write else str(draft),
                "findings": [{"side": side, "ok": f.ok, "topic": f.topic, "value": f.value, "why": f.why}
                             for side, f in proposal.findings],
                "warnings": [str(w.message) for w in caught]})
    else:
        d.info(f"wrote {target}: review it, then `ladder baseline`" if write else f"left the proposal in {draft}")
    if failed and not write:
        runs = "; ".join(f"the {s.name}'s run failed (exit {s.exit_code})" for s in failed)
        raise LadderError(f"{runs}: its log format cannot be read from it, so {target.name} was not written "
                          f"(the proposal is in {draft})", "fix the command (see the findings) and run init again, "
                          "or pass --force to write the proposal as it is")
    return 0
