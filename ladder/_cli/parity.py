"""`ladder parity` and `ladder load-back`: tensor-level parity of a port, and its weights loaded back."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from ladder._cli.main import app, writing
from ladder._display import display
from ladder.migration.spec import load_spec
from ladder.parity.compare import ParityReport
from ladder.parity.runs import exported_weights, run_load_back, run_parity

SPEC_OPT = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec.")


def parity_rows(report: ParityReport) -> list[list[object]]:
    """The parity table: tensor, max abs diff, rel diff, cosine, verdict."""
    return [[r.tensor, f"{r.max_abs_diff:.3g}", f"{r.rel_diff:.3g}", f"{r.cosine:.7f}",
             "ok" if r.passed else "DIFFERS"] for r in report.rows]


@app.command("parity")
def parity_cmd(
    source: Path = typer.Option(..., "--source", help="The port's checkout (its adapter: [parity].target)."),
    out: Path | None = typer.Option(None, "--out", help="Where to write the sides (default runs/<name>/parity-...)."),
    spec_path: Path = SPEC_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the parity report as JSON."),
) -> int:
    """Run both sides' adapters on the reference's weights and batches; exit 1 when a tensor differs."""
    spec = load_spec(spec_path)
    out = (out or spec.runs_dir / f"parity-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    d = display()
    with writing(spec.workspace, "parity"), d.run_progress("parity") as cb:
        runs = run_parity(spec, source.resolve(), out, progress=cb)
    report = runs.report(spec)
    if as_json:
        d.json({"dir": str(out), **report.as_dict()})
    else:
        d.table(f"parity of {source} ({report.tolerance}): {'passed' if report.passed else 'FAILED'}",
                ["tensor", "max |diff|", "rel diff", "cosine", "verdict"], parity_rows(report))
        for problem in report.problems:
            d.error(problem)
        first = report.first_failure
        if first is not None:
            d.error(f"first tensor that differs: {first.tensor} ({first.rule})")
        d.info(f"sides in {out}; `ladder check RUN --parity {out}` judges a run with them")
    return 0 if report.passed else 1


@app.command("load-back")
def load_back_cmd(
    full_run: Path = typer.Argument(..., help="The port's full run directory (it exported [parity].export)."),
    out: Path | None = typer.Option(None, "--out", help="Where to write the evaluation (default <run>-load-back)."),
    spec_path: Path = SPEC_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print evaluate.json as JSON."),
) -> int:
    """Load the port's exported weights into the reference model and run the reference's evaluation."""
    from ladder._util.errors import LadderError

    spec = load_spec(spec_path)
    weights = exported_weights(spec, full_run.resolve())
    if weights is None:
        raise LadderError(f"{full_run} holds no exported weights ([parity].export)",
                          "make the port's full run write them (e.g. a --export flag in the full command)")
    out = (out or full_run.resolve().parent / f"{full_run.resolve().name}-load-back").resolve()
    d = display()
    with writing(spec.workspace, "load-back"), d.run_progress("load-back") as cb:
        record = run_load_back(spec, weights, out, progress=cb)
    result_path = out / "evaluate.json"
    import json

    result = json.loads(result_path.read_text()) if result_path.is_file() else {"error": "no evaluate.json"}
    if as_json:
        d.json({"dir": str(out), "exit_code": record.exit_code, **result})
    else:
        d.table(f"load-back of {full_run}", ["field", "value"], [[k, v] for k, v in result.items()
                                                                 if k not in ("reads", "shapes")])
        d.info(f"`ladder check {full_run} --load-back {out}` judges it (L3 weights_load_back)")
    return 0 if record.exit_code == 0 else 1
