"""The `ladder` console script: a thin layer that parses arguments and calls the library.

One module per command group registers itself here. Errors a user can fix are printed as one message
with the fix, and exit 2 (a usage error too: one line, no traceback); a failed gate exits 1. SIGTERM is
turned into the same path as Ctrl-C, so a run in progress is killed with its whole process tree.
"""

from __future__ import annotations

import signal
import sys
import warnings
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import typer

from ladder._util.errors import LadderError

app = typer.Typer(
    name="ladder",
    help="Prove that a ported ML training repo still computes what the original computed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
    rich_markup_mode=None,  # click's plain help: flags show without a <bool> type, as --flag
)


@app.callback()
def _options(plain: bool = typer.Option(False, "--plain", help="Plain text output, no colours or live progress.")) -> None:
    from ladder._display import set_plain

    if plain:
        set_plain(True)


@contextmanager
def writing(spec_path: Path, command: str) -> Iterator[None]:
    """Hold the workspace's writer lock while a command writes (ladder.migration.workspace)."""
    from ladder.migration.workspace import WorkspaceLock

    path = Path(spec_path)
    workspace = (path if path.is_dir() else path.parent).resolve()
    with WorkspaceLock(workspace, command):
        yield


def _register() -> None:
    from ladder._cli import commands  # noqa: F401  (commands register on `app`)


GLOBAL_OPTIONS = ("--plain",)  # options of `ladder` itself (the callback above), not of its commands


def _usage_errors() -> tuple[type[BaseException], ...]:
    """Click's usage errors: typer >= 0.26 raises those of its own vendored copy (typer._click), and click
    itself need not be installed; pyproject pins typer to the range tests/test_packaging.py checks."""
    out: list[type[BaseException]] = []
    try:
        from typer._click import exceptions as vendored

        out.append(vendored.ClickException)
    except ImportError:
        pass
    try:
        import click

        out.append(click.exceptions.ClickException)
    except ImportError:
        pass
    return tuple(out)


def _interrupt(signum, frame):  # noqa: ANN001
    raise KeyboardInterrupt


def _show_spec_warnings() -> None:
    """Spec warnings (ladder.migration.spec.SpecWarning) print as one plain line each, without a source line."""
    from ladder.migration.spec import SpecWarning

    default = warnings.showwarning

    def show(message, category, filename, lineno, file=None, line=None):  # noqa: ANN001
        if issubclass(category, SpecWarning):
            from ladder._display import display

            display().info(f"warning: {message}")
        else:
            default(message, category, filename, lineno, file, line)

    warnings.showwarning = show


def main() -> None:
    _register()
    _show_spec_warnings()
    signal.signal(signal.SIGTERM, _interrupt)
    try:
        rc = app(standalone_mode=False)
        sys.exit(rc if isinstance(rc, int) else 0)
    except LadderError as e:
        from ladder._display import display

        display().error(str(e))
        sys.exit(e.exit_code)
    except typer.Exit as e:
        sys.exit(e.exit_code)
    except (typer.Abort, KeyboardInterrupt):
        sys.exit(130)
    except _usage_errors() as e:
        if type(e).__name__ == "NoArgsIsHelpError":
            ctx = getattr(e, "ctx", None)
            if ctx is not None:
                typer.echo(ctx.get_help())
            sys.exit(2)
        hint = ""
        ctx = getattr(e, "ctx", None)
        option = getattr(e, "option_name", None)
        if option in GLOBAL_OPTIONS and ctx is not None and ctx.parent is not None:
            root, sub = ctx.find_root().command_path, ctx.info_name
            hint = f" ({option} is an option of ladder itself: put it before the command, `{root} {option} {sub} ...`)"
        elif ctx is not None:
            hint = f" (see `{ctx.command_path} --help`)"
        msg = e.format_message() if hasattr(e, "format_message") else str(e)
        sys.stderr.write(f"error: {msg}{hint}\n")
        sys.exit(2)
