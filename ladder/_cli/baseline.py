"""`ladder baseline` (store the reference baseline) and `ladder baseline verify`."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app
from ladder._display import display
from ladder.baselines.store import create_baseline, versions, verify_baseline
from ladder.migration.spec import load_spec

baseline_app = typer.Typer(help="Store and verify the reference baseline.", invoke_without_command=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.callback()
def baseline(
    ctx: typer.Context,
    seeds: int = typer.Option(1, "--seeds", help="Short runs, one per seed (>= 3 enables calibrated verdicts)."),
    full_seeds: int = typer.Option(1, "--full-seeds", help="Full runs, one per seed."),
    short_only: bool = typer.Option(False, "--short-only", help="Skip the full run."),
    force: bool = typer.Option(False, "--force", help="Write a new version beside an existing baseline."),
    spec_path: Path = typer.Option(Path("ladder.toml"), "--spec"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Run the reference profile (short runs per seed, then the full run) and store it immutably."""
    if ctx.invoked_subcommand is not None:
        return
    spec = load_spec(spec_path)
    d = display()
    with d.run_progress("baseline") as cb:
        b = create_baseline(spec, seeds=seeds, full_seeds=full_seeds, short_only=short_only, force=force,
                            progress=cb)
    rows = [[r.kind, r.seed, r.loss_lines, f"{r.metric:.6g}", f"{r.wall_s:.1f}"] for r in b.short_runs + b.full_runs]
    if as_json:
        d.json({"baseline": str(b.root), "digest": b.digest, "version": b.meta.version,
                "runs": [{"kind": r[0], "seed": r[1], "loss_lines": r[2], "metric": float(r[3]),
                          "wall_s": float(r[4])} for r in rows]})
    else:
        d.table(f"baseline {b.root} (digest {b.digest[:12]})", ["kind", "seed", "loss lines",
                                                               b.meta.name and "metric", "wall s"], rows)


@baseline_app.command("verify")
def verify(
    path: Path | None = typer.Argument(None, help="A baseline version dir; default: every version of the spec's."),
    spec_path: Path = typer.Option(Path("ladder.toml"), "--spec"),
    as_json: bool = typer.Option(False, "--json"),
) -> None:
    """Detect any edited, missing or added file in a stored baseline (exit 1 if any)."""
    if path is not None and (path / "baseline.json").exists():
        roots = [path]
    else:
        roots = versions(path) if path is not None else versions(load_spec(spec_path))
    if not roots:
        from ladder._util.errors import LadderError

        raise LadderError("no baseline to verify", "run `ladder baseline` first, or pass a baseline directory")
    report = {str(r): verify_baseline(r) for r in roots}
    d = display()
    if as_json:
        d.json({"ok": not any(report.values()), "baselines": report})
    else:
        for root, problems in report.items():
            d.info(f"{root}: " + ("intact" if not problems else "MODIFIED: " + "; ".join(problems)))
    if any(report.values()):
        raise typer.Exit(1)
