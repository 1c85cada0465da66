"""`ladder run`: one captured run of the experiment on a profile."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app, writing
from ladder._display import display
from ladder.runs.execute import execute_run
from ladder.migration.spec import load_spec

SPEC_OPT = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec.")


@app.command("run")
def run_cmd(
    on: str = typer.Option(..., "--on", help="Profile: reference or target."),
    kind: str = typer.Option("short", "--kind", help="short or full."),
    seed: int = typer.Option(0, "--seed", help="The seed ({seed} in the command; with [probe] seed, the offset)."),
    source: Path | None = typer.Option(None, "--source", help="Run this checkout instead of the spec's source."),
    spec_path: Path = SPEC_OPT,
    run_dir: Path | None = typer.Option(None, "--run-dir", help="Where to write the run (default runs/<name>/...)."),
    as_json: bool = typer.Option(False, "--json", help="Print run.json's summary as JSON."),
) -> int:
    """Run the short or full experiment once, capture and parse it, and record run.json."""
    spec = load_spec(spec_path)
    d = display()
    with writing(spec.workspace, "run"), d.run_progress(f"{on} {kind} seed {seed}") as cb:
        record = execute_run(spec, on, kind, seed, source=source, run_dir=run_dir, progress=cb)
    summary = {
        "run_dir": str(run_dir or spec.runs_dir / record.run_id),
        "exit_code": record.exit_code, "timed_out": record.timed_out, "loss_lines": record.loss_lines,
        "last_loss": record.loss_curve[-1].loss if record.loss_curve else None,
        "metric_name": record.metric_name, "metric": record.metric, "wall_s": record.wall_s,
        "notes": record.notes,
    }
    if as_json:
        d.json(summary)
    else:
        d.table(f"run {record.run_id}", ["field", "value"], [[k, v] for k, v in summary.items()])
    return 0
