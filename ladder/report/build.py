"""Gather what the report shows: the journal's history, its audit, the baseline and the run records.

Run records and the baseline are loaded from the directories the journal references. A directory
that is missing or unreadable is reported in `problems` and left out of the plots, never guessed.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ladder._util.errors import LadderError
from ladder.journal.audit import AuditResult, History, audit, load_history
from ladder.journal.entries import resolve_ref
from ladder.journal.store import VerifyResult, verify_journal
from ladder.runs.records import RunRecord


@dataclass
class ReportData:
    history: History
    audit: AuditResult
    verify: VerifyResult
    baseline_short: list[RunRecord] = field(default_factory=list)
    baseline_full: list[RunRecord] = field(default_factory=list)
    runs: dict[str, RunRecord] = field(default_factory=dict)  # run_dir as journaled -> record
    problems: list[str] = field(default_factory=list)

    @property
    def metric_name(self) -> str:
        for r in [*self.baseline_short, *self.runs.values()]:
            if r.metric_name:
                return r.metric_name
        return "metric"

    @property
    def direction(self) -> str:
        for r in [*self.baseline_short, *self.runs.values()]:
            return r.metric_direction
        return "max"


def gather(journal_path: Path, root: Path | None = None) -> ReportData:
    history = load_history(journal_path, root)
    root_path = Path(history.root) if history.root else None
    data = ReportData(history=history, audit=audit([history]), verify=verify_journal(Path(journal_path), root_path),
                      problems=list(history.problems))
    if history.baseline is not None:
        from ladder.baselines.store import Baseline

        where = resolve_ref(history.baseline.path, root_path)
        try:
            b = Baseline.load(where)
            data.baseline_short, data.baseline_full = b.short_runs, b.full_runs
        except (LadderError, OSError, ValueError) as e:
            data.problems.append(f"baseline {history.baseline.path}: {e}")
    for a in history.attempts:
        for r in a.runs:
            if r.killed_by_supervisor_crash:
                continue  # ladder died during it: no finished record to plot; the rerun has its own entry
            try:
                data.runs[r.run_dir] = RunRecord.load(resolve_ref(r.run_dir, root_path))
            except (LadderError, OSError, ValueError) as e:
                data.problems.append(f"attempt {a.number} run {r.run_dir}: {e}")
    return data
