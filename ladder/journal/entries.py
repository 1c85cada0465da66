"""What each journal entry kind holds, and the typed helpers the supervisor and the CLI append with.

The store (ladder.journal.store) hashes and chains whatever dict it is given; this module owns the
shape of those dicts: one versioned pydantic model per kind, validated before append and again
when read back (`parse`), so a record written by a newer ladder is refused rather than misread.
It must not decide anything (levels, stop rules): it only writes down what others decided.

Directory references (baseline, run dirs) are stored relative to the migration workspace when
they lie inside it, with the digest of their MANIFEST.sha256, so `verify_journal(path, root)`
can prove later that the evidence was not edited.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field

from ladder._util.errors import LadderError
from ladder._util.hashing import manifest_digest
from ladder.journal.store import Entry, Journal
from ladder.runs.records import RunRecord
from ladder.checks.results import LEVELS, CheckResult, LadderResult, Level, level_index

ENTRY_SCHEMA = 1
AgentKind = Literal["scripted", "claude-code", "human", "ladder"]  # ladder: attempt 0, the original
Decision = Literal["continue", "stop", "accept", "raise-limit"]


class Ref(BaseModel):
    path: str
    digest: str  # sha256 of the directory's MANIFEST.sha256


class EntryContent(BaseModel):
    """Base of every entry's content. `entry_kind` is the store's entry kind, not stored in content."""

    model_config = ConfigDict(extra="forbid")
    entry_kind: ClassVar[str] = ""
    schema_version: int = ENTRY_SCHEMA


class MigrationEntry(EntryContent):
    entry_kind: ClassVar[str] = "migration"
    name: str
    spec_path: str
    protocol: str
    reference_platform: str
    target_platform: str
    started_at: float
    agent: str = ""


class BaselineEntry(EntryContent):
    entry_kind: ClassVar[str] = "baseline"
    path: str
    version: int
    digest: str
    seeds: list[int]
    full_seeds: list[int] = Field(default_factory=list)
    refs: list[Ref]
    extended_for: dict[str, Any] | None = None  # {"attempt": n, "kind": k}: seeds added to decide that check


class AttemptEntry(EntryContent):
    entry_kind: ClassVar[str] = "attempt"
    number: int
    parent: int | None = None
    branch: str = ""
    commit: str = ""
    diff_stat: str = ""
    summary: str = ""
    agent: AgentKind
    started_at: float
    rationale: str = ""
    worktree: str = ""  # relative to the workspace
    agent_seconds: float | None = None
    agent_error: str | None = None  # the agent failed to produce a valid change or declaration
    protected_changes: list[str] = Field(default_factory=list)  # paths the change must not have touched
    pull_request: int | None = None  # the attempt's PR number, when the spec names a GitHub repository


class DeclarationEntry(EntryContent):
    entry_kind: ClassVar[str] = "declaration"
    level: Level | None  # None: the author does not expect even L0
    rationale: str
    agent_status: str = "ok"  # "agent_error" / "protected": the declaration of a rejected attempt
    recovered_from_commit: bool = False  # re-read from the commit trailer after a crash


class RunEntry(EntryContent):
    entry_kind: ClassVar[str] = "run"
    run_dir: str
    kind: Literal["short", "full", "parity", "evaluate"]
    seed: int
    profile: str
    exit_code: int | None
    timed_out: bool
    killed: bool
    metric: float | None
    wall_s: float | None
    digest: str
    refs: list[Ref]
    killed_by_supervisor_crash: bool = False  # ladder died during this run; it was run again
    infrastructure: str | None = None  # the machine or the connection failed (records.INFRASTRUCTURE_KINDS)


class CheckEntry(EntryContent):
    entry_kind: ClassVar[str] = "check"
    run_dir: str
    kind: Literal["short", "full"]
    achieved_level: Level | None
    checks: list[dict[str, Any]]  # CheckResult.model_dump() each

    def results(self) -> list[CheckResult]:
        return [CheckResult.model_validate({k: v for k, v in c.items() if k != "passed"}) for c in self.checks]


class FailureNote(EntryContent):
    """One failed check, explained. `fix` stays empty here: fixes are appended as note_fix entries."""

    entry_kind: ClassVar[str] = "failure_note"
    check: str  # "L2/recompilation"
    level: Level
    cause: str  # which check, measured vs threshold
    diagnosis: str  # rule-based, from the evidence
    diagnosis_llm: str | None = None  # optional plain-words rewrite, stored beside the rule-based one
    silent: bool  # the process exited 0 and printed no error line
    run_dir: str | None  # None: no run (an attempt rejected before any)
    fix: str = ""
    finding: bool = False  # a difference worth knowing that fails no level (another init distribution)


class NoteFixEntry(EntryContent):
    entry_kind: ClassVar[str] = "note_fix"
    note_seq: int
    fix: str


class AttemptResultEntry(EntryContent):
    entry_kind: ClassVar[str] = "attempt_result"
    declared_level: Level | None
    achieved_level: Level | None
    overclaim: int = 0  # levels declared above achieved (0 when not above)
    wall_s: float | None = None
    ended_at: float | None = None
    kind: Literal["short", "full"] = "short"  # the run the level was achieved on
    caught_by: list[str] = Field(default_factory=list)  # "L2/recompilation", ... failed checks
    rejected: str | None = None  # why the attempt was rejected before any run
    rejudged: bool = False  # judged again after baseline seeds were added for an undecided check
    infrastructure: str | None = None  # the run failed for the infrastructure after every retry: not the port's


class DecisionEntry(EntryContent):
    entry_kind: ClassVar[str] = "decision"
    rule: str
    reason: str
    decision: Decision
    by: str
    note: str = ""
    raise_to: float | None = None  # the new limit, for raise-limit


class AgentCostEntry(EntryContent):
    entry_kind: ClassVar[str] = "agent_cost"
    input_tokens: int | None = None
    output_tokens: int | None = None
    cost_usd: float | None = None
    turns: int | None = None


class StopEntry(EntryContent):
    entry_kind: ClassVar[str] = "stop"
    reason: str
    final_level: Level | None


class JudgeVerdict(BaseModel):
    """The optional LLM judge's verdict: recorded beside the rule-based judges, never instead of them."""

    model: str
    verdict: Literal["pass", "reject", "unsure"]
    reasons: list[str] = Field(default_factory=list)
    error: str | None = None  # the judge could not answer (API error, unreadable reply)


class GradeEntry(EntryContent):
    """`ladder grade` of a finished migration (XStack): stage 1, the frozen code's second stage, or the freeze."""

    entry_kind: ClassVar[str] = "grade"
    stage: Literal["stage1", "stage2", "freeze"]
    branch: str
    commit: str
    outcome: str  # "pass" or one of XStack's failure classes (ladder.grade.grader.OUTCOMES)
    checks: list[dict[str, Any]] = Field(default_factory=list)  # the rule-based judges: CheckResult each
    judge: JudgeVerdict | None = None
    refs: list[Ref] = Field(default_factory=list)  # the fresh re-run's directory


KIND_MODELS: dict[str, type[EntryContent]] = {
    m.entry_kind: m
    for m in (MigrationEntry, BaselineEntry, AttemptEntry, DeclarationEntry, RunEntry, CheckEntry, FailureNote,
              NoteFixEntry, AttemptResultEntry, DecisionEntry, AgentCostEntry, StopEntry, GradeEntry)
}


def parse(entry: Entry) -> EntryContent:
    """The entry's content as its typed model; refuses unknown kinds and schema versions."""
    model = KIND_MODELS.get(entry.kind)
    if model is None:
        raise LadderError(f"{entry.label()}: no content model for kind {entry.kind!r}",
                          "read this journal with the ladder version that wrote it")
    # A plain-dict writer may omit the version: that is version 1. Another version is refused.
    version = entry.content.get("schema_version", ENTRY_SCHEMA)
    if version != ENTRY_SCHEMA:
        raise LadderError(f"{entry.label()}: content schema version {version!r}, this ladder reads {ENTRY_SCHEMA}",
                          "read this journal with the ladder version that wrote it")
    return model.model_validate(entry.content)


def append(journal: Journal, content: EntryContent, *, author: str, attempt: int | None = None,
           corrects: int | None = None, reason: str | None = None) -> Entry:
    """Append one typed entry (the store applies its rules and the hash chain)."""
    return journal.append(content.entry_kind, content.model_dump(mode="json"), author=author, attempt=attempt,
                          corrects=corrects, reason=reason)


def ref_path(path: Path, root: Path | None) -> str:
    """A directory as the journal names it: relative to the workspace root when inside it."""
    path = Path(path).resolve()
    if root is not None:
        try:
            return path.relative_to(Path(root).resolve()).as_posix()
        except ValueError:
            pass
    return str(path)


def resolve_ref(path: str, root: Path | None) -> Path:
    p = Path(path)
    return p if p.is_absolute() or root is None else Path(root) / p


def _dir_ref(path: Path, root: Path | None) -> Ref:
    if not (Path(path) / "MANIFEST.sha256").is_file():
        raise LadderError(f"{path} has no MANIFEST.sha256, so the journal cannot seal it",
                          "reference only finished run or baseline directories")
    return Ref(path=ref_path(path, root), digest=manifest_digest(Path(path)))


# ------------------------------------------------------------------ helpers the supervisor calls

def append_migration(journal: Journal, *, name: str, spec_path: str, protocol: str, reference_platform: str,
                     target_platform: str, started_at: float | None = None, author: str = "ladder") -> Entry:
    return append(journal, MigrationEntry(name=name, spec_path=spec_path, protocol=protocol,
                                          reference_platform=reference_platform, target_platform=target_platform,
                                          started_at=time.time() if started_at is None else started_at),
                  author=author)


def append_baseline(journal: Journal, baseline_dir: Path, *, root: Path | None = None,
                    author: str = "ladder", extended_for: dict[str, Any] | None = None) -> Entry:
    """Pin the migration's baseline (its path and manifest digest); appended again when seeds are added."""
    from ladder.baselines.store import Baseline

    b = Baseline.load(Path(baseline_dir))
    ref = _dir_ref(b.root, root)
    return append(journal, BaselineEntry(path=ref.path, version=b.meta.version, digest=ref.digest,
                                         seeds=b.meta.seeds, full_seeds=b.meta.full_seeds, refs=[ref],
                                         extended_for=extended_for),
                  author=author)


def append_attempt(journal: Journal, number: int, *, agent: AgentKind, parent: int | None = None, branch: str = "",
                   commit: str = "", diff_stat: str = "", summary: str = "", started_at: float | None = None,
                   author: str = "agent") -> Entry:
    return append(journal, AttemptEntry(number=number, parent=parent, branch=branch, commit=commit,
                                        diff_stat=diff_stat, summary=summary, agent=agent,
                                        started_at=time.time() if started_at is None else started_at),
                  author=author, attempt=number)


def declare(journal: Journal, attempt: int, level: str | None, rationale: str, *, author: str = "agent",
            corrects: int | None = None, reason: str | None = None) -> Entry:
    """Seal the declared level of an attempt; the store refuses it once a check of the attempt exists."""
    if level is not None and level not in LEVELS:
        raise LadderError(f"unknown level {level!r}", f"declare one of {', '.join(LEVELS)}")
    content = DeclarationEntry(level=level, rationale=rationale)  # type: ignore[arg-type]
    return append(journal, content, author=author, attempt=attempt, corrects=corrects, reason=reason)


def append_run(journal: Journal, attempt: int | None, run_dir: Path, *, root: Path | None = None,
               author: str = "ladder") -> Entry:
    r = RunRecord.load(Path(run_dir))
    ref = _dir_ref(Path(run_dir), root)
    return append(journal, RunEntry(run_dir=ref.path, kind=r.kind, seed=r.seed, profile=r.profile,
                                    exit_code=r.exit_code, timed_out=r.timed_out, killed=r.killed, metric=r.metric,
                                    wall_s=r.wall_s, digest=ref.digest, refs=[ref],
                                    infrastructure=r.infrastructure.kind if r.infrastructure else None),
                  author=author, attempt=attempt)


def append_check(journal: Journal, attempt: int, result: LadderResult, run_kind: str, *,
                 root: Path | None = None, author: str = "ladder") -> Entry:
    return append(journal, CheckEntry(run_dir=ref_path(Path(result.run_dir), root) if result.run_dir else "",
                                      kind=run_kind, achieved_level=result.achieved_level,  # type: ignore[arg-type]
                                      checks=[c.model_dump(mode="json") for c in result.checks]),
                  author=author, attempt=attempt)


def append_failure_notes(journal: Journal, attempt: int | None, notes: list[FailureNote], *,
                         author: str = "ladder") -> list[Entry]:
    return [append(journal, n, author=author, attempt=attempt) for n in notes]


def fix_note(journal: Journal, note_seq: int, fix: str, *, author: str = "human",
             attempt: int | None = None) -> Entry:
    """Fill a failure note's fix by appending (the note itself is never edited)."""
    note = journal.get(note_seq)
    if note is None or note.kind != "failure_note":
        raise LadderError(f"entry {note_seq} is not a failure note", "pass the seq shown by `ladder notes`")
    if not fix.strip():
        raise LadderError("an empty fix", "say what was changed to fix the failure")
    return append(journal, NoteFixEntry(note_seq=note_seq, fix=fix), author=author, attempt=attempt)


def append_attempt_result(journal: Journal, attempt: int, *, declared_level: str | None,
                          achieved_level: str | None, wall_s: float | None, ended_at: float | None = None,
                          kind: str = "short", caught_by: list[str] | None = None, rejected: str | None = None,
                          rejudged: bool = False, infrastructure: str | None = None,
                          author: str = "ladder") -> Entry:
    over = max(0, level_index(declared_level) - level_index(achieved_level))
    return append(journal, AttemptResultEntry(declared_level=declared_level,  # type: ignore[arg-type]
                                              achieved_level=achieved_level,  # type: ignore[arg-type]
                                              overclaim=over, wall_s=wall_s,
                                              ended_at=time.time() if ended_at is None else ended_at,
                                              kind=kind, caught_by=caught_by or [], rejected=rejected,  # type: ignore[arg-type]
                                              rejudged=rejudged, infrastructure=infrastructure),
                  author=author, attempt=attempt)


def append_decision(journal: Journal, *, rule: str, reason: str, decision: Decision, by: str,
                    author: str = "human", attempt: int | None = None, note: str = "",
                    raise_to: float | None = None) -> Entry:
    return append(journal, DecisionEntry(rule=rule, reason=reason, decision=decision, by=by, note=note,
                                         raise_to=raise_to), author=author, attempt=attempt)


def append_agent_cost(journal: Journal, attempt: int, *, input_tokens: int | None = None,
                      output_tokens: int | None = None, cost_usd: float | None = None, turns: int | None = None,
                      author: str = "ladder") -> Entry:
    return append(journal, AgentCostEntry(input_tokens=input_tokens, output_tokens=output_tokens,
                                          cost_usd=cost_usd, turns=turns), author=author, attempt=attempt)


def append_stop(journal: Journal, *, reason: str, final_level: str | None, author: str = "ladder") -> Entry:
    return append(journal, StopEntry(reason=reason, final_level=final_level), author=author)  # type: ignore[arg-type]


# ------------------------------------------------------------------ reading back

def effective(entries: list[Entry]) -> list[Entry]:
    """Entries as they now stand: each corrected entry replaced, in its place, by its latest correction."""
    by_seq = {e.seq: e for e in entries}

    def root(e: Entry) -> int:
        seen = set()
        while e.corrects is not None and e.corrects in by_seq and e.seq not in seen:
            seen.add(e.seq)
            e = by_seq[e.corrects]
        return e.seq

    latest: dict[int, Entry] = {}
    for e in entries:
        r = root(e)
        if r not in latest or e.seq > latest[r].seq:
            latest[r] = e
    return [latest[e.seq] for e in entries if e.seq in latest and root(e) == e.seq]
