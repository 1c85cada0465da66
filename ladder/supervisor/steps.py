"""Idempotent steps of the supervisor, each asking the journal first what is already recorded.

Every function here may be re-executed after a crash or a resume: a recorded agent change, run or
check is found and reused, never redone; a run that was killed half-way (its directory exists but
the journal has no entry for it) is recorded as killed and run again once.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ladder._util.errors import LadderError
from ladder._util.hashing import manifest_digest, verify_manifest, write_manifest
from ladder.agents import Agent, AgentResult, AttemptContext
from ladder.baselines.store import Baseline, create_baseline, extend_baseline, latest, pinned, require_intact
from ladder.checks import CheckContext, run_ladder
from ladder.journal import entries as je
from ladder.journal.store import Entry, Journal, verify_journal
from ladder.migration.protocol import Protocol
from ladder.runs.records import RunRecord
from ladder.checks.results import LEVELS, LadderResult, level_index
from ladder.runs.execute import execute_run
from ladder.migration.spec import Spec, load_spec, load_spec_protocol
from ladder.supervisor import git_ops

MAX_KILLED_RETRIES = 1
Progress = Any


@dataclass
class Migration:
    spec: Spec
    protocol: Protocol
    journal: Journal

    @property
    def workspace(self) -> Path:
        return self.spec.workspace

    def rel(self, path: Path) -> str:
        try:
            return str(Path(path).resolve().relative_to(self.workspace.resolve()))
        except ValueError:
            return str(path)


def journal_path(spec: Spec) -> Path:
    return spec.journal_dir / "journal.sqlite"


def checkpoint_path(spec: Spec) -> Path:
    return spec.journal_dir / "checkpoints.sqlite"


def open_migration(spec_path: str | Path) -> Migration:
    spec = load_spec(spec_path)
    return Migration(spec, load_spec_protocol(spec), Journal(journal_path(spec)))


def ensure_migration(m: Migration, agent: str) -> None:
    if m.journal.last("migration") is None:
        je.append(m.journal, je.MigrationEntry(
            name=m.spec.name, spec_path=str(m.spec.path), protocol=m.protocol.name,
            reference_platform=m.spec.profile("reference").platform,
            target_platform=m.spec.profile("target").platform, agent=agent, started_at=time.time(),
        ), author="ladder")


def ensure_baseline(m: Migration, seeds: int, full_seeds: int, progress: Progress = None) -> Baseline:
    """Pin the baseline: reuse the stored one when it verifies, otherwise run and store one. Once pinned in
    the journal, that version is the migration's for good (see pinned_baseline)."""
    if m.journal.last("baseline") is not None:
        return pinned_baseline(m)
    b = latest(m.spec)
    if b is None:
        b = create_baseline(m.spec, seeds=seeds, full_seeds=full_seeds, progress=progress)
    require_intact(b)
    je.append_baseline(m.journal, b.root, root=m.workspace)
    return b


def pinned_baseline(m: Migration) -> Baseline:
    """The version the journal pinned (a newer one beside it is ignored; `ladder status` says so)."""
    b, _ = pinned(m.spec, journal_path(m.spec))
    if b is None:
        raise LadderError("the migration has no baseline", "run `ladder baseline`, or resume to let the supervisor store one")
    require_intact(b)
    return b


def attempt_entry(m: Migration, n: int) -> Entry | None:
    return m.journal.last("attempt", attempt=n)


def declaration(m: Migration, n: int) -> Entry | None:
    return m.journal.last("declaration", attempt=n)


def ensure_attempt0(m: Migration) -> Entry:
    """Attempt 0 is the original code, as-is, on the target: branch ladder/attempt-0 at HEAD."""
    found = attempt_entry(m, 0)
    if found is not None:
        return found
    repo = git_ops.open_repo(m.spec.source_dir)
    head = repo.head.commit.hexsha
    repo.git.branch("-f", git_ops.branch_name(0), head)
    wt = git_ops.fresh_worktree(repo, m.workspace, 0, head)
    entry = je.append(m.journal, je.AttemptEntry(
        number=0, parent=None, branch=git_ops.branch_name(0), commit=head,
        summary="the original code, unchanged, on the target profile", agent="ladder", worktree=m.rel(wt),
        started_at=time.time()), author="ladder", attempt=0)
    je.declare(m.journal, 0, None, "attempt 0 makes no claim: it records what breaks by itself", author="ladder")
    return entry


def journal_summary(m: Migration) -> str:
    lines = []
    for e in m.journal.entries("attempt_result"):
        c = e.content
        lines.append(f"attempt {e.attempt}: declared {c.get('declared_level') or 'none'}, achieved "
                     f"{c.get('achieved_level') or 'none'} ({c.get('kind', 'short')} run)")
    return "\n".join(lines) or "no attempts yet"


_COMPARES = ("L1", "L3")  # levels whose evidence holds the baseline's numbers


def agent_feedback(m: Migration, n: int) -> tuple[list[dict[str, Any]], Path | None]:
    """What the agent may know of attempt n: every check's name and status; for L0, L2 and L4 the evidence
    (facts of the run itself); for L1 and L3 only which quantity differs from the reference (its numbers,
    bands and the hidden target stay with ladder); and a directory with the run's own stdout and stderr."""
    from ladder.runs.envs import cache_root

    check = check_entry(m, n, "full") or check_entry(m, n, "short")
    items: list[dict[str, Any]] = []
    rejected = rejection(m, n)
    if rejected is not None:
        items.append({"check": f"agent/{rejected[0]}", "status": "failed", "about": rejected[1]})
    if check is None:
        return items, None
    for c in check.content["checks"]:
        if c["status"] in ("passed", "not_applicable"):
            items.append({"check": f"{c['level']}/{c['name']}", "status": c["status"]})
            continue
        about = (f"differs from the reference beyond its seeds' noise ({c['name'].replace('_', ' ')}); the "
                 "reference's numbers are not shown to the agent" if c["level"] in _COMPARES and c["status"] == "failed"
                 else c.get("evidence", "")[:600])
        items.append({"check": f"{c['level']}/{c['name']}", "status": c["status"], "about": about})
    run_dir = m.workspace / check.content["run_dir"] if check.content.get("run_dir") else None
    out = cache_root() / "feedback" / m.spec.name / f"attempt-{n}"
    if run_dir is not None and run_dir.is_dir():
        out.mkdir(parents=True, exist_ok=True)
        for name in ("stdout.log", "stderr.log"):
            if (run_dir / name).is_file():
                shutil.copy2(run_dir / name, out / name)
    return items, (out if out.is_dir() else None)


def agent_read_only(m: Migration) -> list[Path]:
    """What an agent's sandbox may read besides the system: the profiles' environments (to run the code)
    and the repository's git directory (history, read-only)."""
    from ladder.runs.envs import cache_root
    from ladder.runs.runner.sandbox import interpreter_paths

    from ladder.runs.envs import resolve_interpreter

    paths = [cache_root() / "envs", m.spec.source_dir / ".git"]
    for prof in m.spec.profiles.values():
        if not prof.setup:
            try:
                paths += interpreter_paths(resolve_interpreter(prof.python))
            except LadderError:
                pass
    return paths


def last_notes(m: Migration, n: int) -> list[dict[str, Any]]:
    return [e.content for e in m.journal.entries("failure_note", attempt=n)]


def _integrity_snapshot(m: Migration, baseline: Baseline) -> dict[str, str]:
    """What an agent step must leave as it was: the protected files and the journal head (hashes), and
    whether the pinned baseline and the journal still verify."""
    from ladder.migration.workspace import protected_state

    state = protected_state(m.spec)
    state["baseline verifies"] = str(not verify_manifest(baseline.root))
    state["journal verifies"] = str(verify_journal(m.journal.path).ok)
    return state


def run_agent_step(m: Migration, n: int, parent: int, agent: Agent, baseline: Baseline,
                   result_override: AgentResult | None = None) -> dict[str, Any]:
    """Let the agent change a fresh worktree of attempt n, commit, check protected paths, seal the declaration.

    Returns {"status": "ok" | "agent_error" | "protected", ...}. Idempotent: a sealed declaration
    means the step is done; a recorded attempt with no declaration reads the level from its commit.
    """
    if declaration(m, n) is not None:
        why = rejection(m, n)
        return {"status": why[0], "error": why[1], "reused": True} if why else {"status": "ok", "reused": True}
    repo = git_ops.open_repo(m.spec.source_dir)
    found = attempt_entry(m, n)
    if found is not None:  # killed between the two entries: the commit carries the declaration
        level = git_ops.declared_in_commit(repo, found.content["commit"])
        why = rejection(m, n)
        je.append(m.journal, je.DeclarationEntry(level=None if why else level, rationale=found.content.get("rationale", ""),
                                                 recovered_from_commit=True, agent_status=why[0] if why else "ok"),
                  author="agent", attempt=n)
        return {"status": why[0], "error": why[1], "recovered": True} if why else {"status": "ok", "recovered": True}
    parent_entry = attempt_entry(m, parent)
    base = parent_entry.content["commit"] if parent_entry else repo.head.commit.hexsha
    wt = git_ops.fresh_worktree(repo, m.workspace, n, base)
    feedback, feedback_dir = agent_feedback(m, parent)
    ctx = AttemptContext(
        migration=m.spec.name, attempt=n, parent=parent, worktree=wt,
        target_platform=m.spec.profile("target").platform,
        reference_platform=m.spec.profile("reference").platform,
        spec_text=m.spec.path.read_text() if m.spec.path else "", journal_summary=journal_summary(m),
        last_notes=feedback, feedback_dir=feedback_dir, read_only=agent_read_only(m),
        short_command=m.spec.command("short", "target"), session_minutes=m.protocol.agent.session_minutes,
    )
    try:
        from ladder.agents.prompts import build_attempt_prompt, build_system_prompt

        ctx.protocol_prompt = build_system_prompt(ctx) + "\n\n" + build_attempt_prompt(ctx)
    except ImportError:  # prompts are data the claude-code agent needs; others can do without
        pass
    started = time.time()
    before = _integrity_snapshot(m, baseline)
    result = result_override or agent.make_change(ctx)
    after = _integrity_snapshot(m, baseline)
    sha, stat = git_ops.commit_attempt(wt, n, result.declared_level, result.summary or "(no summary)",
                                       journal_head=m.journal.head())
    touched = git_ops.protected_changes(git_ops.changed_paths(repo, base, sha))
    if after != before:
        from ladder.migration.workspace import changes

        touched.append("integrity: changed while the agent worked: " + "; ".join(changes(before, after)[:5]))
    status = "agent_error" if result.error else "protected" if touched else "ok"
    attempt = je.AttemptEntry(
        number=n, parent=parent, branch=git_ops.branch_name(n), commit=sha, diff_stat=stat,
        summary=result.summary, rationale=result.rationale, agent=getattr(agent, "name", "scripted"),
        worktree=m.rel(wt), started_at=started, agent_seconds=round(time.time() - started, 3),
        agent_error=result.error, protected_changes=touched)
    if status == "ok":
        attempt.pull_request = open_pull_request(m, attempt, wt, result.declared_level)
    je.append(m.journal, attempt, author="agent", attempt=n)
    if status == "ok":
        _fix_parent_notes(m, parent, n, result.summary)
    if any(v is not None for v in (result.input_tokens, result.output_tokens, result.cost_usd)):
        je.append_agent_cost(m.journal, n, input_tokens=result.input_tokens, output_tokens=result.output_tokens,
                             cost_usd=result.cost_usd, turns=result.turns)
    je.append(m.journal, je.DeclarationEntry(level=result.declared_level if status == "ok" else None,
                                             rationale=result.rationale, agent_status=status),
              author="agent", attempt=n)
    return {"status": status, "commit": sha, "error": result.error, "protected": touched}


def _fix_parent_notes(m: Migration, parent: int, n: int, summary: str) -> None:
    """The next attempt is the fix the parent's failure notes were waiting for (appended, by the agent)."""
    fixed = {e.content.get("note_seq") for e in m.journal.entries("note_fix")}
    for note in m.journal.entries("failure_note", attempt=parent):
        if note.seq not in fixed:
            je.fix_note(m.journal, note.seq, f"attempt {n}: {summary or '(no summary)'}", author="agent", attempt=n)


def _pull_requests(m: Migration):  # -> ladder.supervisor.github_pr.PullRequests | None
    if m.spec.github is None:
        return None
    from ladder.supervisor.github_pr import pull_requests_from_env

    return pull_requests_from_env(m.spec.github.repo, m.spec.github.api_url, m.spec.github.remote)


def _pr_view(entry: dict[str, Any], declared: str | None, achieved: str | None = None) -> dict[str, Any]:
    return {"attempt": entry["number"], "parent": entry.get("parent"), "summary": entry.get("summary"),
            "rationale": entry.get("rationale"), "branch": entry.get("branch"), "commit": entry.get("commit"),
            "agent": entry.get("agent"), "declared_level": declared, "achieved_level": achieved}


def open_pull_request(m: Migration, attempt: je.AttemptEntry, worktree: Path, declared: str | None) -> int | None:
    """Push the attempt's branch and open its PR (the body: the journal entry, checks pending)."""
    prs = _pull_requests(m)
    if prs is None:
        return None
    from ladder.supervisor.github_pr import render_pr_body

    title = f"ladder attempt {attempt.number} (declared {declared or 'none'}): {attempt.summary[:60]}"
    return prs.open_for_attempt(worktree, attempt.branch, m.spec.github.base, title,
                                render_pr_body(_pr_view(attempt.model_dump(), declared)))


def update_pull_request(m: Migration, n: int) -> None:
    """Re-render the attempt's PR body with its check table, failure notes and achieved level."""
    entry = attempt_entry(m, n)
    number = entry.content.get("pull_request") if entry else None
    prs = _pull_requests(m) if number else None
    if prs is None:
        return
    from ladder.supervisor.github_pr import render_pr_body

    check = check_entry(m, n, "full") or check_entry(m, n, "short")
    decl = declaration(m, n)
    achieved = check.content["achieved_level"] if check else None
    body = render_pr_body(_pr_view(entry.content, decl.content.get("level") if decl else None, achieved),
                          check.content["checks"] if check else None, last_notes(m, n))
    prs.update(number, body, labels=[f"ladder:{achieved or 'none'}"])


def rejection(m: Migration, n: int) -> tuple[str, str] | None:
    """(status, why) when attempt n was rejected before any run, read from its attempt entry: the one source
    of truth, so a supervisor killed between the declaration and the rejection still never runs it."""
    e = attempt_entry(m, n)
    if e is None:
        return None
    c = e.content
    if c.get("agent_error"):
        return "agent_error", str(c["agent_error"])
    if c.get("protected_changes"):
        return "protected", f"the change touched protected paths: {c['protected_changes']}"
    return None


def kill_orphans(m: Migration) -> list[str]:
    """Runs a dead ladder left behind (a run directory without an end): kill what their pids.json lists."""
    from ladder.runs.runner.tree import kill_recorded

    killed = []
    for d in sorted(attempt_runs_dir(m).glob("attempt-*")) + sorted(m.spec.baselines_dir.glob(".*partial/*")):
        rec = d / "run.json"
        try:
            found = RunRecord.load(d) if rec.exists() else None
        except LadderError:
            found = None
        if found is not None and found.remote is not None:
            continue  # detached on its machine: resume follows it there (ensure_run), it is not an orphan
        if found is None or found.ended_at is None:
            pids = kill_recorded(d)
            if pids:
                killed.append(f"{m.rel(d)}: {len(pids)} process(es)")
    return killed


def record_rejected_attempt(m: Migration, n: int, status: str, why: str) -> dict[str, Any]:
    """An attempt the agent could not complete, or that touched protected paths: achieved nothing."""
    if m.journal.last("attempt_result", attempt=n) is None:
        je.append(m.journal, je.FailureNote(check=f"agent/{status}", level="L0", cause=why, diagnosis=why,
                                            silent=False, run_dir=""), author="ladder", attempt=n)
        decl = declaration(m, n)
        je.append_attempt_result(m.journal, n, declared_level=decl.content.get("level") if decl else None,
                                 achieved_level=None, wall_s=None, rejected=status)
    return {"achieved": None}


def _run_entries(m: Migration, n: int, kind: str) -> list[Entry]:
    return [e for e in m.journal.entries("run", attempt=n) if e.content.get("kind") == kind]


def attempt_runs_dir(m: Migration) -> Path:
    """An attempt's runs are evidence of the migration: they live beside its journal."""
    return m.spec.journal_dir / "runs"


def run_dir_for(m: Migration, n: int, kind: str, try_no: int) -> Path:
    return attempt_runs_dir(m) / f"attempt-{n}-{kind}-try{try_no}"


def ensure_run(m: Migration, n: int, kind: str, progress: Progress = None) -> RunRecord:
    """The attempt's run of this kind: reused when recorded, else executed (killed runs: once more). A remote
    run a dead ladder left is followed to its end there, not started again; a run the infrastructure failed
    (connection, machine, remote environment) is started again on the same code, [infrastructure].max_retries
    times, and then stands as what it is."""
    entries = _run_entries(m, n, kind)
    for e in entries:
        if not e.content.get("killed_by_supervisor_crash") and not e.content.get("infrastructure"):
            return RunRecord.load(m.workspace / e.content["run_dir"])
    infra = [e for e in entries if e.content.get("infrastructure")]
    if len(infra) > m.protocol.infrastructure.max_retries:
        return RunRecord.load(m.workspace / infra[-1].content["run_dir"])
    retried = len(infra)
    recorded_dirs = {e.content["run_dir"] for e in entries}
    tries = sorted(attempt_runs_dir(m).glob(f"attempt-{n}-{kind}-try*"))
    for d in tries:
        if m.rel(d) not in recorded_dirs:  # started, never recorded: ladder died during this run
            from ladder.runs.remote.execute import reattach_remote_run

            found = reattach_remote_run(m.spec, d, progress)
            if found is not None:  # it went on (or finished) on its machine
                record = _record_run(m, n, d, found)
                recorded_dirs.add(m.rel(d))
                if record.infrastructure is None or retried >= m.protocol.infrastructure.max_retries:
                    return record
                retried += 1
                continue
            write_manifest(d)
            ref = je.Ref(path=m.rel(d), digest=manifest_digest(d))
            je.append(m.journal, je.RunEntry(run_dir=ref.path, kind=kind, seed=0, profile="target", exit_code=None,  # type: ignore[arg-type]
                                             timed_out=False, killed=True, metric=None, wall_s=None,
                                             digest=ref.digest, refs=[ref], killed_by_supervisor_crash=True),
                      author="ladder", attempt=n)
            recorded_dirs.add(m.rel(d))
    killed = len(recorded_dirs) - retried
    if killed > MAX_KILLED_RETRIES:
        raise LadderError(f"attempt {n}'s {kind} run was killed {killed} times; not starting it again",
                          "look at the run directories under runs/, then `ladder resume --decision stop` or fix the machine")
    attempt = attempt_entry(m, n)
    source = m.workspace / attempt.content["worktree"]
    while True:
        run_dir = run_dir_for(m, n, kind, len(recorded_dirs) + 1)
        record = _record_run(m, n, run_dir, execute_run(m.spec, "target", kind, seed=0, source=source,
                                                         run_dir=run_dir, progress=progress))
        recorded_dirs.add(m.rel(run_dir))
        if record.infrastructure is None or retried >= m.protocol.infrastructure.max_retries:
            return record
        retried += 1
        if progress:
            progress("warning", {"message": f"attempt {n}'s {kind} run failed for the infrastructure "
                                            f"({record.infrastructure.kind}): running it again on the same code "
                                            f"({retried}/{m.protocol.infrastructure.max_retries})"})


def _record_run(m: Migration, n: int, run_dir: Path, record: RunRecord) -> RunRecord:
    shutil.rmtree(run_dir / "work", ignore_errors=True)  # the code is in git at the attempt's commit
    je.append_run(m.journal, n, run_dir, root=m.workspace)
    return record


def check_entry(m: Migration, n: int, kind: str) -> Entry | None:
    for e in reversed(m.journal.entries("check", attempt=n)):
        if e.content.get("kind") == kind:
            return e
    return None


def _judge(m: Migration, n: int, kind: str, baseline: Baseline) -> Entry:
    run = ensure_run(m, n, kind)
    run_dir = m.workspace / _run_entries(m, n, kind)[-1].content["run_dir"]
    from ladder.parity.attempts import parity_options

    ctx = CheckContext(run=run, protocol=m.protocol, baseline=baseline,
                       expected_platform=m.spec.profile("target").platform,
                       full_run=run if kind == "full" else None,
                       options={"run_dir": m.rel(run_dir), **parity_options(m, n, kind, run, run_dir)})
    # a run the infrastructure cut short has no output to compare: nothing above L0 is asked (nor seeds for it)
    result = run_ladder(ctx, up_to="L0" if run.infrastructure else "L4" if kind == "full" else "L2")
    result.run_dir = str(run_dir)
    entry = je.append_check(m.journal, n, result, kind, root=m.workspace)
    _record_notes(m, n, result, run)
    return entry


def _result(m: Migration, n: int, kind: str, found: Entry, rejudged: bool) -> None:
    decl = declaration(m, n)
    started = attempt_entry(m, n).content.get("started_at")
    run = RunRecord.load(m.workspace / found.content["run_dir"]) if found.content.get("run_dir") else None
    je.append_attempt_result(
        m.journal, n, declared_level=decl.content.get("level") if decl else None,
        achieved_level=found.content["achieved_level"], kind=kind,
        wall_s=round(time.time() - started, 3) if started else None,
        caught_by=caught_by(found.content["checks"]), rejudged=rejudged,
        infrastructure=run.infrastructure.kind if run is not None and run.infrastructure else None)
    update_pull_request(m, n)


def seeds_wanted(m: Migration, checks: list[dict[str, Any]], kind: str, baseline: Baseline) -> dict[str, int] | None:
    """The baseline size that would decide the undecided checks ({"seeds": s, "full_seeds": f}), within the
    protocol's max_seeds; None when nothing is undecided or the baseline is already that large."""
    if any(c.get("level") == "L0" and c.get("status") != "passed" for c in checks):
        return None  # a run without L0 has no numbers to decide: more seeds would not help
    more = 0
    for c in checks:
        if c.get("status") == "undecided":
            more = max(more, int(((c.get("details") or {}).get("calibrated") or {}).get("more_seeds") or 0))
    if not more:
        return None
    cap = m.protocol.calibrated.max_seeds
    seeds, fulls = len(baseline.meta.seeds), len(baseline.meta.full_seeds)
    if kind == "full":
        borrowed = any("spread_from" in (((c.get("details") or {}).get("calibrated") or {}).get("band") or {})
                       for c in checks if c.get("status") == "undecided")
        target = min(fulls + more, cap)
        if borrowed or target == fulls:
            target = max(target, min(m.protocol.calibrated.min_seeds, cap))
        return {"seeds": seeds, "full_seeds": target} if target > fulls else None
    target = min(seeds + more, cap)
    return {"seeds": target, "full_seeds": fulls} if target > seeds else None


def ensure_checks(m: Migration, n: int, kind: str, baseline: Baseline, progress: Progress = None) -> dict[str, Any]:
    """Run the ladder on the attempt's run of this kind; record checks, failure notes and the result.

    When a calibrated check is undecided, the baseline gets the seeds it asks for (up to max_seeds, once
    per attempt and kind, journaled as a new pin of the same version) and the run is judged once more;
    still undecided, the stop rules ask the human."""
    found = check_entry(m, n, kind)
    if found is None:
        found = _judge(m, n, kind, baseline)
    if not any(e.content.get("kind") == kind for e in m.journal.entries("attempt_result", attempt=n)):
        _result(m, n, kind, found, rejudged=False)
    extended = [e for e in m.journal.entries("baseline") if e.content.get("extended_for") == {"attempt": n, "kind": kind}]
    if not extended:
        want = seeds_wanted(m, found.content["checks"], kind, baseline)
        if want is not None:
            b = extend_baseline(m.spec, baseline.root, want["seeds"], want["full_seeds"], progress=progress)
            extended = [je.append_baseline(m.journal, b.root, root=m.workspace,
                                           extended_for={"attempt": n, "kind": kind})]
    if extended and found.seq < extended[-1].seq:  # seeds were added after this judgement: judge again
        found = _judge(m, n, kind, pinned_baseline(m))
        _result(m, n, kind, found, rejudged=True)
    return {"achieved": found.content["achieved_level"], "kind": kind}


def caught_by(checks: list[dict[str, Any]]) -> list[str]:
    """The failed checks of the lowest level that failed: what stopped the climb."""
    failed = [c for c in checks if c["status"] == "failed"]
    if not failed:
        return []
    lowest = min(LEVELS.index(c["level"]) for c in failed)
    return [f"{c['level']}/{c['name']}" for c in failed if LEVELS.index(c["level"]) == lowest]


def _record_notes(m: Migration, n: int, result: LadderResult, run: RunRecord) -> None:
    from ladder.journal.notes import draft_notes

    je.append_failure_notes(m.journal, n, draft_notes(result, run))


def achieved(m: Migration, n: int, kind: str) -> str | None:
    e = check_entry(m, n, kind)
    return None if e is None else e.content["achieved_level"]


def reaches(level: str | None, target: str) -> bool:
    return level is not None and level_index(level) >= LEVELS.index(target)
