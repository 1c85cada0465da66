"""Audit of one journal or many: declared against achieved, silent failures, time to each level.

Reads journals only. Every number comes from sealed entries: the declared level from the attempt's
(effective) declaration, the achieved level from its attempt_result or, failing that, the best of
its checks, wall times from run and attempt_result entries. Definitions (the audit's contract):

- judged attempt: has a declaration by the agent or a human (ladder's own "no claim" declaration
  of attempt 0 is not a claim) and an achieved level from an attempt_result or a check.
- achieved level: the attempt_result of its full run if there is one, else its latest
  attempt_result, else the best of its checks.
- overclaim: declared index - achieved index when positive (no level counts -1).
  overclaim_rate = overclaiming / judged; mean_overclaim_levels = mean of those gaps over the
  overclaiming attempts ("when it overclaimed, by how much"); mean_gap_levels = mean signed gap.
- failure: a run of an attempt with at least one failure note; silent when its notes are silent.
- first Lx: the first attempt (by number) whose achieved level is Lx or higher. `attempts` counts
  the attempts up to and including it; `elapsed_s` is its end minus the migration's started_at;
  `run_s` is the summed wall time of every run up to it.
- interventions: decision entries.
"""

from __future__ import annotations

import math
from collections import defaultdict
from pathlib import Path
from typing import Any

import pandas as pd
from pydantic import BaseModel, Field, ValidationError

from ladder._util.errors import LadderError
from ladder.journal.entries import (
    AgentCostEntry,
    AttemptEntry,
    AttemptResultEntry,
    BaselineEntry,
    CheckEntry,
    DecisionEntry,
    DeclarationEntry,
    FailureNote,
    GradeEntry,
    MigrationEntry,
    NoteFixEntry,
    RunEntry,
    StopEntry,
    effective,
    parse,
)
from ladder.journal.store import Journal
from ladder.checks.results import LEVELS, level_index

NONE_LABEL = "none"
MILESTONES = ("L0", "L2", "L3")


class NoteView(BaseModel):
    seq: int
    attempt: int | None
    note: FailureNote
    fix: str = ""  # the latest note_fix, if any
    fixed_by: str | None = None  # author of that note_fix


class AttemptView(BaseModel):
    number: int
    attempt: AttemptEntry | None = None
    declaration: DeclarationEntry | None = None
    declared_by: str | None = None
    runs: list[RunEntry] = Field(default_factory=list)
    checks: list[CheckEntry] = Field(default_factory=list)
    results: list[AttemptResultEntry] = Field(default_factory=list)
    notes: list[NoteView] = Field(default_factory=list)
    cost: AgentCostEntry | None = None

    @property
    def result(self) -> AttemptResultEntry | None:
        full = [r for r in self.results if getattr(r, "kind", None) == "full"]
        return full[-1] if full else (self.results[-1] if self.results else None)

    @property
    def declared_level(self) -> str | None:
        if self.declaration is not None:
            return self.declaration.level
        return self.result.declared_level if self.result is not None else None

    @property
    def declared(self) -> bool:
        """A claim was made: a declaration by the agent or a human (not ladder's own for attempt 0)."""
        if self.declaration is not None:
            return self.declared_by != "ladder"
        return self.result is not None

    @property
    def checked(self) -> bool:
        return self.result is not None or bool(self.checks)

    @property
    def achieved_level(self) -> str | None:
        if self.result is not None:
            return self.result.achieved_level
        levels = [c.achieved_level for c in self.checks]
        return max(levels, key=level_index) if levels else None

    @property
    def run_s(self) -> float:
        return sum(r.wall_s or 0.0 for r in self.runs)

    @property
    def wall_s(self) -> float | None:
        if self.result is not None and self.result.wall_s is not None:
            return self.result.wall_s
        return self.run_s if self.runs else None

    @property
    def ended_at(self) -> float | None:
        ends = [r.ended_at for r in self.results if r.ended_at is not None]
        if ends:
            return max(ends)
        if self.attempt is not None and self.attempt.started_at is not None:
            return self.attempt.started_at + self.run_s
        return None


class History(BaseModel):
    """One migration's journal, read back and grouped by attempt."""

    name: str
    path: str
    root: str | None = None  # the workspace that relative refs resolve against
    migration: MigrationEntry | None = None
    baseline: BaselineEntry | None = None
    attempts: list[AttemptView] = Field(default_factory=list)
    decisions: list[DecisionEntry] = Field(default_factory=list)
    notes: list[NoteView] = Field(default_factory=list)
    stop: StopEntry | None = None
    grades: list[GradeEntry] = Field(default_factory=list)  # `ladder grade`, in order
    problems: list[str] = Field(default_factory=list)  # entries whose content could not be read


def default_root(journal_path: Path) -> Path | None:
    """<workspace>/journals/<name>/journal.sqlite -> <workspace>."""
    p = Path(journal_path).resolve()
    return p.parents[2] if len(p.parents) > 2 and p.parent.parent.name == "journals" else None


def load_history(path: Path, root: Path | None = None) -> History:
    path = Path(path)
    if not path.is_file():
        raise LadderError(f"no journal at {path}", "pass a journals/<name>/journal.sqlite file, or --spec")
    with Journal(path) as j:
        entries = effective(j.entries())
    root = root if root is not None else default_root(path)
    h = History(name=path.parent.name, path=str(path), root=None if root is None else str(root))
    views: dict[int, AttemptView] = {}

    def view(n: int) -> AttemptView:
        return views.setdefault(n, AttemptView(number=n))

    fixes: dict[int, tuple[str, str]] = {}
    for e in entries:
        try:
            c = parse(e) if e.kind in _READ else None
        except LadderError as err:
            # One unreadable entry must not hide the rest of the record: name it and go on.
            h.problems.append(f"{e.label()}: unreadable content ({err.message})")
            continue
        except ValidationError as err:
            fields = "; ".join(f"{'.'.join(map(str, x['loc']))}: {x['msg']}" for x in err.errors()[:3])
            h.problems.append(f"{e.label()}: unreadable content ({fields})")
            continue
        if isinstance(c, MigrationEntry):
            h.migration = c
            h.name = c.name
        elif isinstance(c, BaselineEntry):
            h.baseline = c
        elif isinstance(c, DecisionEntry):
            h.decisions.append(c)
        elif isinstance(c, StopEntry):
            h.stop = c
        elif isinstance(c, GradeEntry):
            h.grades.append(c)
        elif isinstance(c, NoteFixEntry):
            fixes[c.note_seq] = (c.fix, e.author)
        elif isinstance(c, FailureNote):
            nv = NoteView(seq=e.seq, attempt=e.attempt, note=c)
            h.notes.append(nv)
            if e.attempt is not None:
                view(e.attempt).notes.append(nv)
        elif e.attempt is not None and c is not None:
            v = view(e.attempt)
            if isinstance(c, AttemptEntry):
                v.attempt = c
            elif isinstance(c, DeclarationEntry):
                v.declaration, v.declared_by = c, e.author
            elif isinstance(c, RunEntry):
                v.runs.append(c)
            elif isinstance(c, CheckEntry):
                v.checks.append(c)
            elif isinstance(c, AttemptResultEntry):
                v.results.append(c)
            elif isinstance(c, AgentCostEntry):
                v.cost = c
    for nv in h.notes:
        if nv.seq in fixes:
            nv.fix, nv.fixed_by = fixes[nv.seq]
    h.attempts = [views[n] for n in sorted(views)]
    return h


_READ = frozenset({"migration", "baseline", "attempt", "declaration", "run", "check", "failure_note", "note_fix",
                   "attempt_result", "decision", "agent_cost", "stop", "grade"})


# ------------------------------------------------------------------ the audit

class Milestone(BaseModel):
    level: str
    attempt: int | None = None  # the attempt number that first reached it
    attempts: int | None = None  # attempts taken, that one included
    elapsed_s: float | None = None
    run_s: float | None = None


class MigrationAudit(BaseModel):
    name: str
    path: str
    attempts: int
    judged: int
    overclaims: int
    failures: int
    silent_failures: int
    interventions: int
    final_level: str | None
    milestones: list[Milestone]
    cost_usd: float | None
    grade: str | None = None  # the outcome of its latest `ladder grade` (stage and outcome)


class AuditResult(BaseModel):
    schema_version: int = 1
    journals: list[str]
    attempts: int
    judged: int
    overclaims: int
    overclaim_rate: float | None
    mean_overclaim_levels: float | None
    mean_gap_levels: float | None
    failures: int
    silent_failures: int
    silent_share: float | None
    interventions: int
    interventions_per_migration: float | None
    matrix: dict[str, dict[str, int]]  # declared -> achieved -> attempts (judged attempts)
    migrations: list[MigrationAudit]
    caught_by: dict[str, int] = Field(default_factory=dict)  # check -> attempts it stopped (parity, load-back...)
    problems: list[str] = Field(default_factory=list)  # unreadable entries, left out of the numbers

    def matrix_frame(self) -> pd.DataFrame:
        return pd.DataFrame(self.matrix).T.fillna(0).astype(int)


def _label(level: str | None) -> str:
    return NONE_LABEL if level is None else level


def attempts_frame(histories: list[History]) -> pd.DataFrame:
    """One row per attempt of every journal: the table every audit number is computed from."""
    rows = []
    for h in histories:
        for a in h.attempts:
            judged = a.declared and a.checked
            gap = level_index(a.declared_level) - level_index(a.achieved_level) if judged else math.nan
            rows.append({"migration": h.name, "path": h.path, "attempt": a.number, "declared": a.declared,
                         "checked": a.checked, "judged": judged, "declared_level": _label(a.declared_level),
                         "achieved_level": _label(a.achieved_level), "achieved_index": level_index(a.achieved_level),
                         "gap": gap, "run_s": a.run_s, "ended_at": a.ended_at,
                         "cost_usd": a.cost.cost_usd if a.cost else None})
    cols = ["migration", "path", "attempt", "declared", "checked", "judged", "declared_level", "achieved_level",
            "achieved_index", "gap", "run_s", "ended_at", "cost_usd"]
    return pd.DataFrame(rows, columns=cols)


def failures_frame(histories: list[History]) -> pd.DataFrame:
    """One row per failed run (a run with at least one failure note)."""
    rows = []
    for h in histories:
        runs: dict[tuple[int | None, str], list[bool]] = defaultdict(list)
        for nv in h.notes:
            if nv.note.finding:  # a finding fails no level: it is no failure
                continue
            runs[(nv.attempt, nv.note.run_dir)].append(nv.note.silent)
        rows += [{"migration": h.name, "attempt": a, "run_dir": r, "notes": len(s), "silent": all(s)}
                 for (a, r), s in runs.items()]
    return pd.DataFrame(rows, columns=["migration", "attempt", "run_dir", "notes", "silent"])


def _milestones(h: History, frame: pd.DataFrame) -> list[Milestone]:
    mine = frame[frame["path"] == h.path].sort_values("attempt")
    origin = h.migration.started_at if h.migration else (
        h.attempts[0].attempt.started_at if h.attempts and h.attempts[0].attempt else None)
    out = []
    for lvl in MILESTONES:
        reached = mine[mine["achieved_index"] >= level_index(lvl)]
        if reached.empty:
            out.append(Milestone(level=lvl))
            continue
        first = reached.iloc[0]
        upto = mine[mine["attempt"] <= first["attempt"]]
        ended = first["ended_at"]
        elapsed = None if origin is None or ended is None or pd.isna(ended) else float(ended - origin)
        out.append(Milestone(level=lvl, attempt=int(first["attempt"]), attempts=len(upto), elapsed_s=elapsed,
                             run_s=float(upto["run_s"].sum())))
    return out


def _ratio(a: float, b: float) -> float | None:
    return None if b == 0 else a / b


def audit(histories: list[History]) -> AuditResult:
    frame = attempts_frame(histories)
    fails = failures_frame(histories)
    judged = frame[frame["judged"]]
    over = judged[judged["gap"] > 0]
    order = [*LEVELS[::-1], NONE_LABEL]
    matrix: dict[str, dict[str, int]] = {}
    if not judged.empty:
        table = pd.crosstab(judged["declared_level"], judged["achieved_level"])
        rows = [r for r in order if r in table.index]
        cols = [c for c in order if c in table.columns]
        table = table.loc[rows, cols]
        matrix = {str(r): {str(c): int(table.loc[r, c]) for c in cols} for r in rows}
    migrations = []
    for h in histories:
        mine, mf = frame[frame["path"] == h.path], fails[fails["migration"] == h.name]
        costs = [a.cost.cost_usd for a in h.attempts if a.cost and a.cost.cost_usd is not None]
        mj = mine[mine["judged"]]
        migrations.append(MigrationAudit(
            name=h.name, path=h.path, attempts=len(mine), judged=len(mj), overclaims=int((mj["gap"] > 0).sum()),
            failures=len(mf), silent_failures=int(mf["silent"].sum()), interventions=len(h.decisions),
            final_level=h.stop.final_level if h.stop else (
                max((a.achieved_level for a in h.attempts), key=level_index, default=None)),
            milestones=_milestones(h, frame), cost_usd=sum(costs) if costs else None,
            grade=f"{h.grades[-1].stage}: {h.grades[-1].outcome}" if h.grades else None))
    caught: dict[str, int] = {}
    for h in histories:
        for a in h.attempts:
            for name in (a.result.caught_by if a.result is not None else []):
                caught[name] = caught.get(name, 0) + 1
    interventions = sum(len(h.decisions) for h in histories)
    return AuditResult(
        journals=[h.path for h in histories], attempts=len(frame), judged=len(judged), overclaims=len(over),
        overclaim_rate=_ratio(len(over), len(judged)),
        mean_overclaim_levels=float(over["gap"].mean()) if len(over) else None,
        mean_gap_levels=float(judged["gap"].mean()) if len(judged) else None,
        failures=len(fails), silent_failures=int(fails["silent"].sum()),
        silent_share=_ratio(int(fails["silent"].sum()), len(fails)),
        interventions=interventions, interventions_per_migration=_ratio(interventions, len(histories)),
        matrix=matrix, migrations=migrations, caught_by=dict(sorted(caught.items())),
        problems=[f"{h.path}: {p}" for h in histories for p in h.problems])


def audit_paths(paths: list[Path]) -> AuditResult:
    return audit([load_history(p) for p in paths])


# ------------------------------------------------------------------ markdown

def fmt_pct(x: float | None) -> str:
    return "n/a" if x is None else f"{x:.0%}"


def fmt_num(x: float | None, fmt: str = ".2f") -> str:
    return "n/a" if x is None else format(x, fmt)


def fmt_duration(s: float | None) -> str:
    if s is None:
        return "n/a"
    return f"{s:.0f}s" if s < 120 else f"{s / 60:.1f}min" if s < 7200 else f"{s / 3600:.1f}h"


def audit_markdown(a: AuditResult) -> str:
    lines = [
        "## Audit", "",
        f"- journals: {len(a.journals)}; attempts: {a.attempts} ({a.judged} with a declaration and a check)",
        f"- overclaim rate: {fmt_pct(a.overclaim_rate)} ({a.overclaims} of {a.judged} judged attempts ended below "
        f"their declared level); mean overclaim: {fmt_num(a.mean_overclaim_levels)} levels; "
        f"mean declared minus achieved: {fmt_num(a.mean_gap_levels)} levels",
        f"- silent failures: {fmt_pct(a.silent_share)} ({a.silent_failures} of {a.failures} failed runs exited 0 "
        "with no error)",
        f"- interventions: {a.interventions} ({fmt_num(a.interventions_per_migration)} per migration)",
        "- caught by (attempts each check stopped): "
        + (", ".join(f"{k} {v}" for k, v in a.caught_by.items()) or "none"), "",
    ]
    if a.problems:
        lines += ["Entries left out (unreadable):", ""] + [f"- {p}" for p in a.problems] + [""]
    if a.matrix:
        cols = sorted({c for row in a.matrix.values() for c in row}, key=lambda c: level_index(
            None if c == NONE_LABEL else c), reverse=True)
        lines += ["Declared (rows) against achieved (columns):", "",
                  "| declared \\ achieved | " + " | ".join(cols) + " |", "|---|" + "---|" * len(cols)]
        lines += [f"| {r} | " + " | ".join(str(row.get(c, 0)) for c in cols) + " |" for r, row in a.matrix.items()]
        lines.append("")
    lines += ["| migration | attempts | overclaims | failures (silent) | interventions | final | "
              + " | ".join(f"first {m}" for m in MILESTONES) + " | agent $ |",
              "|---|---|---|---|---|---|" + "---|" * len(MILESTONES) + "---|"]
    for m in a.migrations:
        firsts = [("never" if s.attempt is None else
                   f"attempt {s.attempt} ({s.attempts} attempts, {fmt_duration(s.elapsed_s)}, runs {fmt_duration(s.run_s)})")
                  for s in m.milestones]
        lines.append(f"| {m.name} | {m.attempts} | {m.overclaims}/{m.judged} | {m.failures} ({m.silent_failures}) | "
                     f"{m.interventions} | {m.final_level or 'none'} | " + " | ".join(firsts)
                     + f" | {fmt_num(m.cost_usd)} |" + (f" grade {m.grade}" if m.grade else ""))
    return "\n".join(lines) + "\n"


def audit_json(a: AuditResult) -> dict[str, Any]:
    return a.model_dump(mode="json")
