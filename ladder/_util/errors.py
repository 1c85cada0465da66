"""Errors a user can fix. The CLI prints them as one clear message (no traceback) and exits 2."""

from __future__ import annotations


class LadderError(Exception):
    """A problem the user can fix; `fix` says how."""

    exit_code = 2

    def __init__(self, message: str, fix: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.fix = fix

    def __str__(self) -> str:
        return self.message if not self.fix else f"{self.message}\n  fix: {self.fix}"


class SpecError(LadderError):
    """Every problem found in a spec or protocol file, reported together."""

    def __init__(self, path: str, problems: list[tuple[str, object, str]]) -> None:
        self.path = path
        self.problems = problems  # (key, value, fix)
        lines = [f"{path}: {len(problems)} problem(s)"]
        for key, value, fix in problems:
            lines.append(f"  - {key} = {value!r}: {fix}")
        super().__init__("\n".join(lines))


class IntegrityError(LadderError):
    """A stored baseline or journal does not match its recorded hashes."""

    exit_code = 1
