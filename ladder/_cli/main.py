"""The `ladder` console script: a thin layer that parses arguments and calls the library.

One module per command group registers itself here. Errors a user can fix are printed as one
message with the fix, and exit 2; a failed gate exits 1.
"""

from __future__ import annotations

import sys

import typer

from ladder._util.errors import LadderError

app = typer.Typer(
    name="ladder",
    help="Prove that a ported ML training repo still computes what the original computed.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    add_completion=False,
)


@app.callback()
def _options(plain: bool = typer.Option(False, "--plain", help="Plain text output, no colours or live progress.")) -> None:
    from ladder._display import set_plain

    if plain:
        set_plain(True)


def _register() -> None:
    from ladder._cli import commands  # noqa: F401  (commands register on `app`)


def main() -> None:
    _register()
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
    except Exception as e:  # click usage errors
        import click

        if isinstance(e, click.exceptions.ClickException):
            e.show()
            sys.exit(2)
        raise
