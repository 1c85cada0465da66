"""`ladder supervise`, `ladder resume`, `ladder status`: the migration's main loop."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app, writing
from ladder._display import display

SPEC = typer.Option(Path("ladder.toml"), "--spec", help="The migration spec.")


# The supervisor (LangGraph and its checkpointer) is imported when a command needs it: `ladder run` and
# `ladder check` must work in an environment that has only ladder's core dependencies.


def show_status(st, as_json: bool) -> int:
    d = display()
    if as_json:
        d.json(st.model_dump())
    else:
        rows = [[a["attempt"], a["declared"] or "-", a["achieved"] or "none", ", ".join(a["caught_by"]) or "-",
                 a["summary"][:60]] for a in st.attempts]
        d.table(f"migration {st.migration}", ["attempt", "declared", "achieved", "caught by", "change"], rows)
        if st.waiting_for:
            w = st.waiting_for
            if w.get("waiting_for") == "human":
                d.info(f"waiting for a human change on attempt {w['attempt']}: {w['how']}")
            else:
                d.info(f"PAUSED by stop rule {w.get('rule')}: {w.get('reason')}\n"
                       f"  answer with: ladder resume --decision {'|'.join(w.get('choices', []))}")
        elif st.finished:
            d.info(f"finished: {st.finished_reason or ''}" + (f"\nreport: {st.report}" if st.report else ""))
        elif st.next_nodes:
            d.info(f"interrupted before {st.next_nodes}: run `ladder resume` to go on")
    return 0


@app.command("supervise")
def supervise_cmd(
    agent: str = typer.Option(..., "--agent", help="claude-code, scripted:FILE or human."),
    max_attempts: int = typer.Option(10, "--max-attempts", min=1, help="Stop after this many attempts."),
    seeds: int = typer.Option(5, "--seeds", help="Baseline short-run seeds, if no baseline is stored yet."),
    full_seeds: int = typer.Option(3, "--full-seeds", help="Baseline full-run seeds, if no baseline is stored yet."),
    spec_path: Path = SPEC,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> int:
    """Run the whole protocol: baseline, attempt 0, agent attempts, checks, stop rules, full run, report."""
    from ladder.supervisor.driver import supervise

    with writing(spec_path, "supervise"), display().run_progress("supervise") as cb:
        st = supervise(spec_path, agent, max_attempts=max_attempts, seeds=seeds, full_seeds=full_seeds, progress=cb)
    return show_status(st, as_json)


@app.command("resume")
def resume_cmd(
    decision: str | None = typer.Option(None, "--decision", help="continue, stop, accept or raise-limit."),
    raise_to: float | None = typer.Option(None, "--raise-to", help="New value of the limit (raise-limit)."),
    note: str = typer.Option("", "-m", "--note", help="Why (journaled)."),
    spec_path: Path = SPEC,
    as_json: bool = typer.Option(False, "--json", help="Print the result as JSON."),
) -> int:
    """Answer a pause, or continue a migration whose supervisor was killed."""
    from ladder.supervisor.driver import resume

    with writing(spec_path, "resume"), display().run_progress("resume") as cb:
        st = resume(spec_path, decision, raise_to, note, progress=cb)
    return show_status(st, as_json)


@app.command("status")
def status_cmd(spec_path: Path = SPEC,
               allow_unverified: bool = typer.Option(False, "--allow-unverified", help="Show a journal that fails "
                                                     "verification anyway, under a banner (default: refuse it)."),
               as_json: bool = typer.Option(False, "--json", help="Print the status as JSON.")) -> int:
    """Where the migration stands: attempts, declared vs achieved, what it waits for (reads; never waits for a
    writer)."""
    from ladder._cli.journal import verified
    from ladder.migration.workspace import holder
    from ladder.supervisor.driver import status

    _, _, banner = verified(spec_path, None, allow_unverified)
    if banner:
        display().error(banner)
    busy = holder(Path(spec_path).resolve().parent)
    if busy and not as_json:
        display().info(f"running now: {busy}")
    return show_status(status(spec_path), as_json)


@app.command("reset")
def reset_cmd(keep_baseline: bool = typer.Option(False, "--keep-baseline", help="Keep the stored baseline (the "
                                                 "next migration pins it again)."),
              spec_path: Path = SPEC, as_json: bool = typer.Option(False, "--json", help="Print what was done as JSON.")) -> int:
    """Start the migration over: archive its journal (and baselines), remove the attempts' worktrees and branches."""
    from ladder.supervisor.driver import reset

    with writing(spec_path, "reset"):
        out = reset(spec_path, keep_baseline)
    d = display()
    if as_json:
        d.json(out)
    else:
        for key, items in out.items():
            d.info(f"{key.replace('_', ' ')}: {', '.join(items) if items else '-'}")
    return 0
