"""`ladder init [DIR]`: write a commented ladder.toml template."""

from __future__ import annotations

from pathlib import Path

import typer

from ladder._cli.main import app
from ladder._display import display
from ladder._util.errors import LadderError
from ladder.migration.spec import TEMPLATE


@app.command()
def init(directory: Path = typer.Argument(Path("."), help="Where to write ladder.toml."),
         force: bool = typer.Option(False, help="Overwrite an existing ladder.toml.")) -> None:
    """Write a commented ladder.toml template to fill in."""
    directory.mkdir(parents=True, exist_ok=True)
    target = directory / "ladder.toml"
    if target.exists() and not force:
        raise LadderError(f"{target} already exists", "edit it, or pass --force to overwrite it")
    target.write_text(TEMPLATE)
    display().info(f"wrote {target}: fill in source, commands, [parse] patterns and the two profiles")
