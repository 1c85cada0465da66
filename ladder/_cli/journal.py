"""`ladder journal verify|fix-note`, `ladder declare`, `ladder notes`, `ladder audit`, `ladder report`.

The journal path defaults to the spec's `journals/<name>/journal.sqlite`; relative references in
it resolve against the spec's workspace.
"""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app, writing
from ladder._display import display
from ladder._util.errors import LadderError

journal_app = typer.Typer(rich_markup_mode=None, help="The sealed journal of a migration.", no_args_is_help=True)
app.add_typer(journal_app, name="journal")

SPEC_OPT = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec.")
JOURNAL_OPT = typer.Option(None, "--journal", help="A journal file (default: the spec's journals/<name>/journal.sqlite).")
JOURNAL_NAME = "journal.sqlite"


def locate(spec_path: Path, journal: Path | None, must_exist: bool = True) -> tuple[Path, Path | None]:
    """The journal file and the workspace its relative references resolve against."""
    from ladder.journal.audit import default_root

    if journal is not None:
        path = Path(journal)
        root = default_root(path)
    else:
        from ladder.migration.spec import load_spec

        if not Path(spec_path).exists():
            raise LadderError(f"no spec at {spec_path}", "run in the migration workspace, or pass --spec or --journal")
        spec = load_spec(spec_path)
        path, root = spec.journal_dir / JOURNAL_NAME, spec.workspace
    if must_exist and not path.is_file():
        raise LadderError(f"no journal at {path}", "start the migration first, or pass --journal FILE")
    return path, root


ALLOW_OPT = typer.Option(False, "--allow-unverified", help="Show a journal that fails verification anyway, "
                         "under a banner (default: refuse it).")


def anchors_for(spec_path: Path, journal: Path | None) -> list[tuple[int, str, str]] | None:
    """The journal heads the attempts' commits recorded (None when there is no spec to find the repo)."""
    if journal is not None or not Path(spec_path).exists():
        return None
    from ladder.migration.spec import load_spec
    from ladder.supervisor.git_ops import journal_anchors

    spec = load_spec(spec_path)
    return journal_anchors(spec.source_dir, spec.name)


def verified(spec_path: Path, journal: Path | None, allow: bool) -> tuple[Path, Path | None, str | None]:
    """The journal and its root, refused when it fails verification (a banner instead, when allowed)."""
    from ladder._util.errors import IntegrityError
    from ladder.journal.store import verify_journal

    path, root = locate(spec_path, journal)
    result = verify_journal(path, root, anchors_for(spec_path, journal))
    if result.ok:
        return path, root, None
    text = f"{path} FAILS VERIFICATION ({len(result.problems)} problem(s)): " + "; ".join(result.problems[:3])
    if not allow:
        raise IntegrityError(text, "run `ladder journal verify` for the details; --allow-unverified shows it anyway")
    return path, root, "UNVERIFIED JOURNAL: " + text


@journal_app.command("verify")
def verify(
    spec_path: Path = SPEC_OPT,
    journal: Path | None = JOURNAL_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Recompute the hash chain and the referenced baselines and run dirs; exit 1 naming the first bad entry."""
    from ladder.journal.store import verify_journal

    path, root = locate(spec_path, journal)
    anchors = anchors_for(spec_path, journal)
    result = verify_journal(path, root, anchors)
    d = display()
    if as_json:
        d.json({"journal": str(path), **result.model_dump()})
    elif result.ok:
        anchored = (f"; {len(anchors)} anchors in git agree" if anchors else
                    "; no git anchors checked" + (" (pass --spec to find them)" if anchors is None else " (none recorded)"))
        d.info(f"{path}: {result.entries} entries, chain and references intact{anchored}")
    else:
        first = f"first bad entry: {result.first_bad_seq}; " if result.first_bad_seq is not None else ""
        d.error(f"{path}: {first}{len(result.problems)} problem(s)\n  - " + "\n  - ".join(result.problems))
    if not result.ok:
        raise typer.Exit(1)


@journal_app.command("fix-note")
def fix_note_cmd(
    note_seq: int = typer.Argument(..., help="The failure note's entry number (shown by `ladder notes`)."),
    message: str = typer.Option(..., "-m", "--message", help="What was changed to fix it."),
    attempt: int | None = typer.Option(None, "--attempt", help="The attempt that made the fix."),
    spec_path: Path = SPEC_OPT,
    journal: Path | None = JOURNAL_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Record the fix of a failure note (appended; the note itself is never edited)."""
    from ladder.journal.entries import fix_note
    from ladder.journal.store import Journal

    path, root = locate(spec_path, journal)
    with writing(root or path.parent, "journal fix-note"), Journal(path) as j:
        e = fix_note(j, note_seq, message, author="human", attempt=attempt)
    _report_entry(e, as_json)


def _report_entry(e, as_json: bool) -> None:
    d = display()
    if as_json:
        d.json(e.model_dump())
    else:
        d.info(f"appended {e.label()} by {e.author}")


@app.command("declare")
def declare_cmd(
    level: str = typer.Argument(..., help="L0..L4, or 'none' when not even L0 is expected."),
    attempt: int = typer.Option(..., "--attempt", help="The attempt this declaration is for."),
    message: str = typer.Option(..., "-m", "--message", help="Why you believe this level is reached."),
    spec_path: Path = SPEC_OPT,
    journal: Path | None = JOURNAL_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> None:
    """Seal a human's declared level for an attempt, before any check of it runs."""
    from ladder.journal.entries import declare
    from ladder.journal.store import Journal

    if not message.strip():
        raise LadderError("an empty rationale", "say with -m why you expect this level")
    path, root = locate(spec_path, journal, must_exist=False)
    with writing(root or path.parent, "declare"), Journal(path) as j:
        e = declare(j, attempt, None if level.lower() == "none" else level.upper(), message, author="human")
    _report_entry(e, as_json)


@app.command("notes")
def notes_cmd(
    attempt: int | None = typer.Option(None, "--attempt", help="Only this attempt's notes."),
    spec_path: Path = SPEC_OPT,
    journal: Path | None = JOURNAL_OPT,
    allow_unverified: bool = ALLOW_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the notes as JSON."),
) -> None:
    """Print the failure notes (cause, diagnosis, fix, silent?) as markdown for review."""
    from ladder.journal.audit import load_history
    from ladder.report.render import notes_markdown

    path, root, banner = verified(spec_path, journal, allow_unverified)
    if banner:
        display().error(banner)
    notes = [n for n in load_history(path, root).notes if attempt is None or n.attempt == attempt]
    if as_json:
        display().json([{"seq": n.seq, "attempt": n.attempt, **n.note.model_dump(mode="json"), "fix": n.fix,
                         "fixed_by": n.fixed_by} for n in notes])
    else:
        typer.echo(notes_markdown(notes), nl=False)


@app.command("audit")
def audit_cmd(
    journals: list[Path] = typer.Argument(None, help="Journal files (default: the spec's journal)."),
    spec_path: Path = SPEC_OPT,
    allow_unverified: bool = ALLOW_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the audit as JSON."),
) -> None:
    """Declared against achieved, overclaim rate, silent failures, time to L0/L2/L3, interventions."""
    from ladder.journal.audit import audit_json, audit_markdown, audit_paths

    if journals:
        paths = []
        for j in journals:
            p, _, banner = verified(spec_path, Path(j), allow_unverified)
            if banner:
                display().error(banner)
            paths.append(p)
    else:
        p, _, banner = verified(spec_path, None, allow_unverified)
        if banner:
            display().error(banner)
        paths = [p]
    result = audit_paths(paths)
    if as_json:
        display().json(audit_json(result))
    else:
        typer.echo(audit_markdown(result), nl=False)


@app.command("report")
def report_cmd(
    html: Path | None = typer.Option(None, "--html", help="Where to write the HTML (default: beside the journal)."),
    spec_path: Path = SPEC_OPT,
    journal: Path | None = JOURNAL_OPT,
    allow_unverified: bool = ALLOW_OPT,
    as_json: bool = typer.Option(False, "--json", help="Print the paths written as JSON."),
) -> None:
    """Write the report: one self-contained HTML file and its markdown twin (.md beside it)."""
    from ladder.report import write_report

    path, root, banner = verified(spec_path, journal, allow_unverified)
    if banner:
        display().error(banner)
    html_path, md_path, data = write_report(path, html or path.parent / "report.html", root)
    problems = [*data.verify.problems, *data.problems]
    if as_json:
        display().json({"html": str(html_path), "markdown": str(md_path), "journal_ok": data.verify.ok,
                        "problems": problems})
    else:
        display().info(f"wrote {html_path} and {md_path}" + (f" ({len(problems)} problem(s) shown in it)"
                                                             if problems else ""))
