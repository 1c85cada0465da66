"""`ladder check RUN_DIR`: the ladder for one run against the baseline."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app
from ladder._display import display
from ladder.baselines.store import resolve_baseline
from ladder.checks import CheckContext, run_ladder
from ladder.migration.protocol import load_protocol
from ladder.runs.records import RunRecord
from ladder._util.errors import LadderError
from ladder.migration.spec import load_spec, load_spec_protocol
from ladder.parity.context import check_options


def cell(value: object, width: int = 60) -> str:
    """A table cell for a measured value or threshold: numbers to 4 significant digits, long lists counted
    (the JSON output keeps everything)."""
    if value is None:
        return "-"
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, float):
        return f"{value:.4g}"
    if isinstance(value, dict):
        text = ", ".join(f"{k}={cell(v, width)}" for k, v in value.items() if not isinstance(v, (list, dict)))
    elif isinstance(value, (list, tuple)):
        text = f"[{len(value)} values]" if len(value) > 6 else "[" + ", ".join(cell(v, width) for v in value) + "]"
    else:
        text = str(value)
    return text if len(text) <= width else text[: width - 1] + "…"


def check_run(run_dir: Path, spec_path: Path | None, baseline_dir: Path | None, full_run: Path | None = None,
              parity_dir: Path | None = None, load_back_dir: Path | None = None):
    record = RunRecord.load(run_dir)
    spec = load_spec(spec_path) if spec_path is not None and Path(spec_path).exists() else None
    protocol = load_spec_protocol(spec) if spec else load_protocol()
    note = None
    if baseline_dir is None and spec is not None:
        from ladder.baselines.store import pinned

        baseline, note = pinned(spec)
    else:
        baseline = resolve_baseline(spec, baseline_dir)
    if note:
        display().info(note)
    if baseline is not None:
        from ladder.baselines.store import require_intact

        require_intact(baseline)
    expected = spec.profile(record.profile).platform if spec and record.profile in spec.profiles else record.platform
    ctx = CheckContext(run=record, protocol=protocol, baseline=baseline, expected_platform=expected,
                       full_run=RunRecord.load(full_run) if full_run else None,
                       options={"run_dir": str(run_dir),
                                **check_options(spec, Path(run_dir), parity_dir, load_back_dir)})
    return run_ladder(ctx)


def declared_for(run_dir: Path, spec_path: Path | None) -> str | None:
    """The level the agent declared for the attempt this run belongs to (journals/<name>/runs/attempt-N-...)."""
    import re

    m = re.match(r"attempt-(\d+)-", Path(run_dir).name)
    if m is None or spec_path is None or not Path(spec_path).exists():
        return None
    spec = load_spec(spec_path)
    journal = spec.journal_dir / "journal.sqlite"
    if not journal.is_file():
        return None
    from ladder.journal.store import Journal

    with Journal(journal) as j:
        decl = j.last("declaration", attempt=int(m.group(1)))
    return decl.content.get("level") if decl else None


@app.command("check")
def check(
    run_dir: Path = typer.Argument(..., help="A run directory written by `ladder run`."),
    baseline_dir: Path | None = typer.Option(None, "--baseline", help="Baseline dir (default: the one the migration "
                                             "pinned, else the spec's latest)."),
    full_run: Path | None = typer.Option(None, "--full-run", help="The attempt's full run, for L3/L4."),
    parity_dir: Path | None = typer.Option(None, "--parity", help="The sides `ladder parity` wrote (L1 parity)."),
    load_back_dir: Path | None = typer.Option(None, "--load-back", help="The evaluation `ladder load-back` wrote "
                                              "(L3 weights_load_back)."),
    require: str | None = typer.Option(None, "--require", help="Exit 1 below this level (L0-L4). Default: the level "
                                       "declared for the run's attempt, else L0."),
    spec_path: Path = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> int:
    """Print the ladder (L0-L4) for a run; exit 1 below the required level (a CI gate)."""
    from ladder.checks.results import LEVELS, level_index

    if require is not None and require.upper() not in LEVELS:
        raise LadderError(f"--require {require!r} is not a level", f"use one of {', '.join(LEVELS)}")
    result = check_run(run_dir, spec_path, baseline_dir, full_run, parity_dir, load_back_dir)
    d = display()
    if as_json:
        d.json(result.to_json_dict())
    else:
        rows = [[c.level, c.name, c.status, cell(c.measured), cell(c.threshold), c.evidence] for c in result.checks]
        d.table(f"ladder for {run_dir}: achieved {result.achieved_level or 'none'}",
                ["level", "check", "status", "measured", "threshold", "evidence"], rows)
        from ladder.journal.notes import findings

        for note in findings(result):  # fail no level, but a reviewer should know
            d.info(f"finding ({note.check}): {note.diagnosis}")
    need = (require or declared_for(run_dir, spec_path) or "L0").upper()
    ok = level_index(result.achieved_level) >= level_index(need)
    if not ok and not as_json:
        d.error(f"achieved {result.achieved_level or 'no level'}, below the required {need}")
    return 0 if ok else 1
