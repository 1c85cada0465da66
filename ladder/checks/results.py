"""The ladder's levels and the typed results of its checks.

A check returns a CheckResult (level, status, measured value, threshold, evidence); the ladder for one
run is a LadderResult. These are data, written into the journal; nothing here judges a run.
"""

from __future__ import annotations

from typing import Any, Iterable, Literal

from pydantic import BaseModel, Field

LEVELS = ("L0", "L1", "L2", "L3", "L4")
Level = Literal["L0", "L1", "L2", "L3", "L4"]
CheckStatus = Literal["passed", "failed", "not_checked", "not_applicable", "undecided"]
# not_applicable: the fault the check looks for cannot exist in this run (no PyTorch/XLA, no aten::
# fallback); it does not stop the climb. not_checked: the check could not measure; it stops the climb.
CLIMBS = ("passed", "not_applicable")


class CheckResult(BaseModel):
    """One check's verdict with the evidence a reviewer needs."""

    level: Level
    name: str
    status: CheckStatus
    measured: Any = None
    threshold: Any = None
    evidence: str = ""
    details: dict[str, Any] = Field(default_factory=dict)

    @property
    def passed(self) -> bool | None:
        return {"passed": True, "failed": False}.get(self.status)

    def model_dump(self, **kw: Any) -> dict[str, Any]:  # type: ignore[override]
        d = super().model_dump(**kw)
        d["passed"] = self.passed
        return d


class LadderResult(BaseModel):
    schema_version: int = 1
    run_dir: str
    baseline: str | None = None
    achieved_level: Level | None
    checks: list[CheckResult]

    def to_json_dict(self) -> dict[str, Any]:
        return {
            "schema_version": self.schema_version,
            "run_dir": self.run_dir,
            "baseline": self.baseline,
            "achieved_level": self.achieved_level,
            "checks": [c.model_dump() for c in self.checks],
        }


def level_index(level: str | None) -> int:
    """-1 for no level, 0..4 for L0..L4."""
    return -1 if level is None else LEVELS.index(level)


def highest_level(levels: "Iterable[str | None]") -> str | None:
    """The highest of some levels (None when none reached any)."""
    best = max(levels, key=level_index, default=None)
    return best if level_index(best) >= 0 else None
