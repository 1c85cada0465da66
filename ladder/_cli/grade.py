"""`ladder grade`: the XStack grading of a finished migration (fresh re-run, frozen stage 2, judges)."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.check import cell
from ladder._cli.main import app, writing
from ladder._display import display
from ladder.migration.spec import load_spec


@app.command("grade")
def grade_cmd(
    branch: str | None = typer.Option(None, "--branch", help="The branch to grade (default: the journal's best "
                                      "attempt)."),
    stage2: bool = typer.Option(False, "--stage2", help="Second stage: only the protocol's allowed paths may differ "
                                "from the code graded in stage 1."),
    judge: bool = typer.Option(False, "--judge", help="Also ask the LLM judge (needs ANTHROPIC_API_KEY)."),
    spec_path: Path = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec."),
    as_json: bool = typer.Option(False, "--json", help="Print the grade as JSON."),
) -> int:
    """Re-run the port from its own setup file on a fresh copy and judge it; exit 1 unless it passes."""
    from ladder.grade.grader import grade

    spec = load_spec(spec_path)
    d = display()
    with writing(spec.workspace, "grade"), d.run_progress(f"grade {'stage 2' if stage2 else 'stage 1'}") as cb:
        report = grade(spec, stage="stage2" if stage2 else "stage1", branch=branch, judge=judge, progress=cb)
    if as_json:
        d.json(report.as_dict())
    else:
        rows = [[c.level, c.name, c.status, cell(c.measured), c.evidence] for c in report.checks]
        if report.judge is not None:
            rows.append(["-", f"judge ({report.judge.model})", report.judge.verdict, "-",
                         report.judge.error or " | ".join(report.judge.reasons)])
        d.table(f"grade of {report.branch} ({report.commit[:10]}): {report.outcome}",
                ["level", "judge", "status", "measured", "evidence"], rows)
    return 0 if report.outcome == "pass" else 1
