"""The supervisor's parity steps: an attempt's parity sides and its weights loaded back, run once, journaled.

Idempotent like every supervisor step: a side already journaled for the attempt is reused, never redone.
The reference side is the same for every attempt (the reference code does not change), so it runs once
per migration into `runs/parity-reference/`. Parity runs beside the short run, and only when the short
run finished (a crash already stops the ladder at L0); the load-back runs after a full run that exported.
Must not: judge (the checks do) or decide what runs next (the graph does).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from ladder.journal import entries as je
from ladder._util.errors import LadderError
from ladder.parity.context import attempt_dir
from ladder.parity.runs import SIDES_FILE, ParityRuns, exported_weights, run_load_back, run_parity
from ladder.runs.records import RunRecord

if TYPE_CHECKING:
    from ladder.supervisor.steps import Migration

REFERENCE_DIR = "parity-reference"


def _journaled(m: "Migration", run_dir: Path) -> bool:
    rel = m.rel(run_dir)
    return any(e.content.get("run_dir") == rel for e in m.journal.entries("run"))


def _journal(m: "Migration", attempt: int | None, run_dir: Path) -> None:
    if (run_dir / "MANIFEST.sha256").is_file() and not _journaled(m, run_dir):
        je.append_run(m.journal, attempt, run_dir, root=m.workspace)


def _finished(run_dir: Path) -> bool:
    try:
        return RunRecord.load(run_dir).ended_at is not None
    except Exception:
        return False


def ensure_parity(m: "Migration", n: int, source: Path, progress: Any = None) -> ParityRuns:
    """Attempt n's parity sides: reused when its target side finished before, else run (and journaled)."""
    from ladder.supervisor.steps import attempt_runs_dir

    runs_dir = attempt_runs_dir(m)
    out = attempt_dir(runs_dir, n, "parity")
    if (out / SIDES_FILE).is_file() and _finished(ParityRuns.load(out).target):
        runs = ParityRuns.load(out)
    else:
        runs = run_parity(m.spec, source, out, reference_dir=runs_dir / REFERENCE_DIR, progress=progress)
    _journal(m, None, runs.reference)
    _journal(m, n, runs.target)
    return runs


def ensure_load_back(m: "Migration", n: int, full_run_dir: Path, progress: Any = None) -> dict[str, Any]:
    """Attempt n's exported weights evaluated by the reference: the weights_load_back option."""
    from ladder.supervisor.steps import attempt_runs_dir

    weights = exported_weights(m.spec, full_run_dir)
    if weights is None:
        return {"dir": None, "why": f"the full run exported no {m.spec.parity.export} ([parity].export)"}
    out = attempt_dir(attempt_runs_dir(m), n, "load-back")
    if not ((out / "evaluate.json").is_file() and _finished(out)):
        run_load_back(m.spec, weights, out, progress=progress)
    _journal(m, n, out)
    return {"dir": str(out)}


def parity_options(m: "Migration", n: int, kind: str, run: RunRecord, run_dir: Path,
                   progress: Any = None) -> dict[str, Any]:
    """The parity and weights_load_back options of attempt n's run of this kind (empty without [parity])."""
    p = m.spec.parity
    if p is None:
        return {}
    out: dict[str, Any] = {}
    if run.exit_code == 0 and not run.timed_out:
        attempt = m.journal.last("attempt", attempt=n)
        source = m.workspace / attempt.content["worktree"]
        try:
            out["parity"] = ensure_parity(m, n, source, progress).as_option()
        except LadderError as e:  # e.g. a profile that cannot run a side: said in the check, not a crash
            out["parity"], out["parity_why"] = None, f"not run: {e.message}" + (f" ({e.fix})" if e.fix else "")
    else:
        out["parity"], out["parity_why"] = None, "not run: the attempt's run did not finish"
    if p.export and p.evaluate and kind == "full":
        out["load_back"] = ensure_load_back(m, n, run_dir, progress) if run.exit_code == 0 else None
    elif p.export and p.evaluate:
        out["load_back"] = None
    return out
