"""The ladder: checks registered by level, run in order, and the achieved level derived from them.

A check is a small function `(ctx: CheckContext) -> CheckResult` that does one job and reports the
measured value, the threshold and the evidence. Checks never raise for a bad run: a missing input is
a `not_checked` or `failed` result with the reason in its evidence.

The registry is explicit: `@register(level, name)`. ladder's own checks live in l0..l4; a third-party
package adds its own by declaring an entry point in the group `ladder.checks` that names a module (or a
function) whose import (or call) registers them, e.g. in its pyproject.toml:
    [project.entry-points."ladder.checks"]
    license_headers = "mypkg.ladder_checks"
A plugin that fails to load is reported as a failed check of its own, never silently dropped.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable

from ladder.runs.records import RunRecord
from ladder.checks.results import CLIMBS, LEVELS, CheckResult, LadderResult

if TYPE_CHECKING:
    from ladder.baselines.store import Baseline
    from ladder.migration.protocol import Protocol

CheckFn = Callable[["CheckContext"], CheckResult]


@dataclass(frozen=True)
class CheckContext:
    run: RunRecord
    protocol: "Protocol"
    baseline: "Baseline | None" = None
    expected_platform: str = ""
    full_run: RunRecord | None = None  # the attempt's full run, for L3/L4
    options: dict[str, Any] = field(default_factory=dict)  # e.g. hidden target path, price overrides

    def reference(self) -> RunRecord | None:
        """The baseline run of the same kind as this run (short for short, full for full)."""
        return self.reference_full() if self.run.kind == "full" else self.reference_short()

    def reference_short(self) -> RunRecord | None:
        """The baseline short run to compare with: same seed if stored, else the first seed."""
        return None if self.baseline is None else self.baseline.reference("short", self.run.seed)

    def reference_full(self) -> RunRecord | None:
        return None if self.baseline is None else self.baseline.reference("full", self.run.seed)


_REGISTRY: dict[str, list[tuple[str, CheckFn]]] = {lvl: [] for lvl in LEVELS}


def register(level: str, name: str) -> Callable[[CheckFn], CheckFn]:
    """Register a check at a level; the ladder runs checks in level order, then registration order."""

    def deco(fn: CheckFn) -> CheckFn:
        if any(n == name for n, _ in _REGISTRY[level]):
            raise ValueError(f"check {level}/{name} registered twice")
        _REGISTRY[level].append((name, fn))
        return fn

    return deco


def registered() -> dict[str, list[str]]:
    _load_builtin()
    return {lvl: [n for n, _ in fns] for lvl, fns in _REGISTRY.items()}


def not_checked(level: str, name: str, why: str) -> CheckResult:
    return CheckResult(level=level, name=name, status="not_checked", evidence=why)  # type: ignore[arg-type]


_PLUGIN_ERRORS: list[tuple[str, str]] = []
_loaded = False


def _load_builtin() -> None:
    # Importing the level modules registers their checks (idempotent: modules import once).
    global _loaded
    from ladder.checks import l0, l1, l2, l3, l4, load_back, parity, randomness  # noqa: F401

    if _loaded:
        return
    _loaded = True
    from importlib.metadata import entry_points

    for ep in entry_points(group="ladder.checks"):
        try:
            obj = ep.load()
            if callable(obj):
                obj()
        except Exception as e:  # a broken plugin must be seen, not skipped
            _PLUGIN_ERRORS.append((ep.name, f"{type(e).__name__}: {e}"))


def achieved_level(checks: list[CheckResult]) -> str | None:
    """The highest level whose checks, and all lower levels' checks, passed.

    A level with no result, or with any result that is not `passed` (or `not_applicable`: the fault it
    looks for cannot exist in this run), stops the climb: a check that was not run never counts as passed.
    """
    best = None
    for lvl in LEVELS:
        at = [c for c in checks if c.level == lvl]
        if not at or any(c.status not in CLIMBS for c in at) or all(c.status == "not_applicable" for c in at):
            break
        best = lvl
    return best


def run_ladder(ctx: CheckContext, up_to: str = "L4") -> LadderResult:
    _load_builtin()
    results: list[CheckResult] = []
    for lvl in LEVELS[: LEVELS.index(up_to) + 1]:
        fns = _REGISTRY[lvl]
        if not fns:
            results.append(not_checked(lvl, "level", f"{lvl} checks are not implemented"))
        for name, fn in fns:
            try:
                results.append(fn(ctx))
            except Exception as e:  # a bug in a check must not pass a run, nor hide the other checks
                results.append(CheckResult(level=lvl, name=name, status="failed",  # type: ignore[arg-type]
                                           evidence=f"check raised {type(e).__name__}: {e}"))
    for name, error in _PLUGIN_ERRORS:
        results.append(CheckResult(level="L0", name=f"plugin:{name}", status="failed",  # type: ignore[arg-type]
                                   evidence=f"the check plugin {name!r} failed to load: {error}"))
    l3 = [c for c in results if c.level == "L3"]
    if l3 and any(c.status not in CLIMBS for c in l3):
        # Faster and cheaper means nothing for a run whose main result is not preserved.
        results = [c if c.level != "L4" else not_checked("L4", c.name, "not judged: L3 did not pass (speed and cost "
                                                                          "count only for a run that keeps the result)")
                   for c in results]
    return LadderResult(
        run_dir=ctx.options.get("run_dir", ""),
        baseline=str(ctx.baseline.root) if ctx.baseline is not None else None,
        achieved_level=achieved_level(results),  # type: ignore[arg-type]
        checks=results,
    )
