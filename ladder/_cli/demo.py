"""`ladder demo`: supervise a whole recorded port of the example on this machine."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app
from ladder._display import display


@app.command("demo")
def demo(
    target: str = typer.Option("xla", "--target", help="xla (PyTorch/XLA on its CPU device) or jax (JAX on CPU)."),
    directory: Path | None = typer.Option(None, "--dir", help="Work directory (default ./ladder-demo-TARGET)."),
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> int:
    """Port the example classifier with a recorded agent and show what ladder catches."""
    from ladder.demo import run_demo

    directory = (directory or Path(f"ladder-demo-{target}")).resolve()
    d = display()
    with d.run_progress(f"demo {target}") as cb:
        workspace, st = run_demo(target, directory, progress=cb)
    journal = workspace / "journals" / st.migration
    paths = {"workspace": str(workspace), "journal": str(journal / "journal.sqlite"),
             "notes": f"ladder notes --spec {workspace / 'ladder.toml'}",
             "report": str(journal / "report.html"), "report_md": str(journal / "report.md")}
    if as_json:
        d.json({"paths": paths, "status": st.model_dump()})
        return 0
    rows = [[a["attempt"], a["declared"] or "-", a["achieved"] or "none", ", ".join(a["caught_by"]) or "-",
             a["summary"][:70]] for a in st.attempts]
    d.table(f"ladder demo ({target}): {st.finished_reason or ''}",
            ["attempt", "declared", "achieved", "caught by", "change"], rows)
    for k, v in paths.items():
        d.info(f"{k:10s} {v}")
    return 0
