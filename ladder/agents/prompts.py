"""The agent's prompts, filled from an attempt's context.

The words live in protocols/prompts/*.md (data, not code); this module only fills their
{placeholders}. The supervisor uses the same two functions for the Claude Code agent and for the
message it shows a human agent, so both read the same instructions. Nothing here may add secrets:
the prompt goes to the agent verbatim.
"""

from __future__ import annotations

import string
from pathlib import Path
from typing import Any

from ladder._util.errors import LadderError
from ladder.agents import AttemptContext
from ladder.migration.protocol import PROTOCOLS_DIR

PROMPTS_DIR = PROTOCOLS_DIR / "prompts"
from ladder.migration.workspace import PROTECTED_PATHS  # noqa: E402  (the one list; ladder verifies afterwards)
# Order in which a failure note's fields are shown; other keys follow in their own order.
_NOTE_FIELDS = ("check", "level", "cause", "diagnosis", "fix")


def _fill(template_name: str, values: dict[str, Any], prompts_dir: Path) -> str:
    path = prompts_dir / template_name
    try:
        template = path.read_text()
    except OSError as e:
        raise LadderError(f"cannot read the prompt template {path}: {e}", "restore protocols/prompts/ from git") from e
    wanted = {field for _, field, _, _ in string.Formatter().parse(template) if field}
    unknown = sorted(wanted - values.keys())
    if unknown:
        raise LadderError(
            f"{path}: unknown placeholder(s) {', '.join('{' + u + '}' for u in unknown)}",
            f"use only {', '.join('{' + k + '}' for k in sorted(values))}, and write literal braces as {{{{ }}}}",
        )
    return template.format_map(values)


def render_notes(notes: list[dict[str, Any]]) -> str:
    """Failure notes as a markdown list, one note a line: what the agent must fix next."""
    if not notes:
        return "(none: the attempt you build on left no failure notes)"
    lines = []
    for note in notes:
        silent = note.get("silent")
        prefix = "[silent] " if silent is True else "[loud] " if silent is False else ""
        keys = [k for k in _NOTE_FIELDS if k in note] + [k for k in note if k not in _NOTE_FIELDS and k != "silent"]
        body = "; ".join(f"{k}: {note[k]}" for k in keys if note[k] not in (None, ""))
        lines.append(f"- {prefix}{body}")
    return "\n".join(lines)


def _values(ctx: AttemptContext) -> dict[str, Any]:
    return {
        "migration": ctx.migration,
        "attempt": ctx.attempt,
        "parent": f"attempt {ctx.parent}" if ctx.parent is not None else "the original code",
        "target_platform": ctx.target_platform,
        "reference_platform": ctx.reference_platform,
        "journal_summary": ctx.journal_summary.strip() or "(no attempts yet)",
        "last_notes": render_notes(ctx.last_notes),
        "short_command": ctx.short_command or "(not given)",
        "spec_text": ctx.spec_text.strip(),
        "protected_paths": ", ".join(f"`{p}`" for p in PROTECTED_PATHS),
    }


def build_system_prompt(ctx: AttemptContext, prompts_dir: Path = PROMPTS_DIR) -> str:
    """The agent's role, the protocol's stages and levels, and its rules (protocols/prompts/system.md)."""
    return _fill("system.md", _values(ctx), prompts_dir)


def build_attempt_prompt(ctx: AttemptContext, prompts_dir: Path = PROMPTS_DIR) -> str:
    """This attempt's task: number, parent, journal so far, last failure notes, run command (attempt.md)."""
    return _fill("attempt.md", _values(ctx), prompts_dir)
