"""`ladder baseline` (store the reference baseline) and `ladder baseline verify`."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app, writing
from ladder._display import display
from ladder.baselines.store import (DEFAULT_FULL_SEEDS, DEFAULT_SEEDS, create_baseline, extend_baseline, pinned,
                                   versions, verify_baseline)
from ladder.migration.spec import load_spec

baseline_app = typer.Typer(rich_markup_mode=None, help="Store and verify the reference baseline.", invoke_without_command=True)
app.add_typer(baseline_app, name="baseline")


@baseline_app.callback()
def baseline(
    ctx: typer.Context,
    seeds: int = typer.Option(DEFAULT_SEEDS, "--seeds", help="Short runs, one per seed (calibrated verdicts need "
                              "the protocol's min_seeds, 3 by default)."),
    full_seeds: int = typer.Option(DEFAULT_FULL_SEEDS, "--full-seeds", help="Full runs, one per seed (fewer than "
                                   "min_seeds: the full run borrows the short seeds' spread)."),
    short_only: bool = typer.Option(False, "--short-only", help="Skip the full run."),
    force: bool = typer.Option(False, "--force", help="Write a new version beside an existing baseline."),
    spec_path: Path = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Run the reference profile (short runs per seed, then the full runs) and store it immutably."""
    if ctx.invoked_subcommand is not None:
        return
    spec = load_spec(spec_path)
    d = display()
    with writing(spec.workspace, "baseline"), d.run_progress("baseline") as cb:
        b = create_baseline(spec, seeds=seeds, full_seeds=full_seeds, short_only=short_only, force=force,
                            progress=cb)
    _report(b, as_json)


def _report(b, as_json: bool) -> None:
    d = display()
    rows = [[r.kind, r.seed, r.loss_lines, f"{r.metric:.6g}", f"{r.wall_s:.1f}"] for r in b.short_runs + b.full_runs]
    if as_json:
        d.json({"baseline": str(b.root), "digest": b.digest, "version": b.meta.version,
                "identical_runs": b.meta.identical_runs,
                "runs": [{"kind": r[0], "seed": r[1], "loss_lines": r[2], "metric": float(r[3]),
                          "wall_s": float(r[4])} for r in rows]})
    else:
        d.table(f"baseline {b.root} (digest {b.digest[:12]})", ["kind", "seed", "loss lines", "metric", "wall s"],
                rows)
    if b.meta.identical_runs:
        from ladder.checks.stats import IDENTICAL

        d.error("warning: " + IDENTICAL.format(k=len(b.meta.seeds)))


@baseline_app.command("extend")
def extend(
    seeds: int = typer.Option(..., "--seeds", help="Bring the short runs to this many seeds in all (new seeds "
                              "continue the numbering)."),
    full_seeds: int | None = typer.Option(None, "--full-seeds", help="Bring the full runs to this many in all."),
    spec_path: Path = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Add runs to the stored baseline version the migration uses (nothing stored changes; verify still proves
    every earlier digest)."""
    spec = load_spec(spec_path)
    with writing(spec.workspace, "baseline extend"):
        _extend(spec, seeds, full_seeds, as_json)


def _extend(spec, seeds: int, full_seeds: int | None, as_json: bool) -> None:
    b, note = pinned(spec)
    if b is None:
        from ladder._util.errors import LadderError

        raise LadderError("no baseline to extend", "run `ladder baseline` first")
    d = display()
    if note:
        d.info(note)
    with d.run_progress("baseline extend") as cb:
        b = extend_baseline(spec, b.root, seeds, full_seeds, progress=cb)
    _report(b, as_json)


@baseline_app.command("verify")
def verify(
    path: Path | None = typer.Argument(None, help="A baseline version dir; default: every version of the spec's."),
    spec_path: Path = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
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
