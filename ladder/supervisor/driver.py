"""Drive the graph from the CLI or a test: start, resume, and say where it stands.

A scripted agent may carry the decisions a human took at each pause (a recorded migration); they
are replayed through the same path as a human's answer and journaled as such.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Callable

from pydantic import BaseModel

from ladder._util.errors import LadderError
from ladder.agents import Agent
from ladder.supervisor import steps
from ladder.supervisor.graph import DECISIONS, State, compiled, resume_command, thread


class SupervisorStatus(BaseModel):
    migration: str
    finished: bool
    finished_reason: str | None = None
    next_nodes: list[str] = []
    waiting_for: dict[str, Any] | None = None
    attempt: int | None = None
    attempts: list[dict[str, Any]] = []
    report: str | None = None


def _auto_decider(agent: Agent | None) -> Callable[[int, dict], dict | None] | None:
    decide = getattr(agent, "decision_after", None)
    if decide is None:
        return None

    def replay(attempt: int, payload: dict) -> dict | None:
        choice = decide(attempt)
        return None if choice is None else {"decision": choice, "by": "scripted replay"}

    return replay


def _agent_for(agent_spec: str, m: steps.Migration) -> Agent | None:
    if agent_spec.startswith("scripted:"):
        from ladder.agents import make_agent

        return make_agent(agent_spec, m.workspace, m.protocol)
    return None


def supervise(spec_path: Path, agent: str, max_attempts: int = 10, seeds: int = 1, full_seeds: int = 1,
              progress: Any = None, agent_obj: Agent | None = None) -> SupervisorStatus:
    m = steps.open_migration(spec_path)
    graph = compiled(m)
    agent_obj = agent_obj or _agent_for(agent, m)
    cfg = thread(m, progress=progress, agent_obj=agent_obj, auto_decision=_auto_decider(agent_obj))
    snapshot = graph.get_state(cfg)
    if snapshot.values:
        raise LadderError(f"migration {m.spec.name!r} was already started",
                          "use `ladder resume` (or `ladder status`); `ladder reset` archives it to start over")
    state: State = {"spec_path": str(m.spec.path), "agent": agent, "max_attempts": max_attempts,
                    "seeds": seeds, "full_seeds": full_seeds}
    graph.invoke(state, cfg)
    return status(spec_path, m=m)


def resume(spec_path: Path, decision: str | None = None, raise_to: float | None = None, note: str = "",
           progress: Any = None, agent_obj: Agent | None = None) -> SupervisorStatus:
    if decision is not None and decision not in DECISIONS:
        raise LadderError(f"unknown decision {decision!r}", f"use one of {', '.join(DECISIONS)}")
    m = steps.open_migration(spec_path)
    graph = compiled(m)
    cfg = thread(m)
    snap = graph.get_state(cfg)
    if not snap.values:
        raise LadderError(f"migration {m.spec.name!r} has not started", "run `ladder supervise` first")
    killed = steps.kill_orphans(m)  # a dead ladder's runs must not hold the machine while we go on
    if killed and progress:
        progress("warning", {"message": "killed runs left by a ladder that died: " + "; ".join(killed)})
    agent_obj = agent_obj or _agent_for(snap.values.get("agent", ""), m)
    cfg = thread(m, progress=progress, agent_obj=agent_obj, auto_decision=_auto_decider(agent_obj))
    waiting = _interrupt_payload(snap)
    if waiting is not None and waiting.get("waiting_for") != "human" and decision is None:
        raise LadderError(f"the migration is paused: {waiting.get('reason')}",
                          f"answer with `ladder resume --decision {'|'.join(DECISIONS)}`")
    if waiting is not None:
        extra: dict[str, Any] = {"note": note}
        if raise_to is not None:
            extra["raise"] = raise_to
        graph.invoke(resume_command(decision or "continue", **extra), cfg)
    elif snap.next:
        graph.invoke(None, cfg)  # killed mid-node: re-run from the last checkpoint
    return status(spec_path, m=m)


def _interrupt_payload(snap: Any) -> dict[str, Any] | None:
    for task in snap.tasks or ():
        for intr in getattr(task, "interrupts", ()) or ():
            return intr.value
    return None


def status(spec_path: Path, m: steps.Migration | None = None) -> SupervisorStatus:
    m = m or steps.open_migration(spec_path)
    graph = compiled(m)
    snap = graph.get_state(thread(m))
    attempts = []
    for e in m.journal.entries("attempt"):
        n = e.attempt
        decl = steps.declaration(m, n)
        results = {r.content.get("kind"): r.content for r in m.journal.entries("attempt_result", attempt=n)}
        final = results.get("full") or results.get("short") or {}
        attempts.append({"attempt": n, "branch": e.content.get("branch"), "commit": e.content.get("commit", "")[:10],
                         "summary": e.content.get("summary", ""),
                         "declared": decl.content.get("level") if decl else None,
                         "achieved": final.get("achieved_level"),
                         "caught_by": final.get("caught_by", []),
                         "full_run": "full" in results})
    report = m.spec.journal_dir / "report.html"
    vals = snap.values or {}
    return SupervisorStatus(
        migration=m.spec.name, finished=bool(vals) and not snap.next, finished_reason=vals.get("finished"),
        next_nodes=list(snap.next or ()), waiting_for=_interrupt_payload(snap), attempt=vals.get("attempt"),
        attempts=attempts, report=str(report) if report.exists() else None,
    )


def reset(spec_path: Path, keep_baseline: bool = False) -> dict[str, Any]:
    """Start over: archive the journal (and, unless kept, the baselines) under `.archive/`, remove the
    attempts' worktrees and branches. Nothing is deleted that is evidence: archives keep every run."""
    import shutil
    import time as _time

    import git

    from ladder.migration.spec import load_spec
    from ladder.supervisor import git_ops

    spec = load_spec(spec_path)
    stamp = _time.strftime("%Y%m%d-%H%M%S")
    out: dict[str, Any] = {"archived": [], "worktrees_removed": [], "branches_deleted": []}
    try:
        repo = git.Repo(spec.source_dir)
    except (git.InvalidGitRepositoryError, git.NoSuchPathError):
        repo = None
    if repo is not None:
        for block in repo.git.worktree("list", "--porcelain").split("\n\n"):
            lines = dict(line.split(" ", 1) for line in block.splitlines() if " " in line)
            if lines.get("branch", "").startswith("refs/heads/ladder/attempt-"):
                repo.git.worktree("remove", "--force", lines["worktree"])
                out["worktrees_removed"].append(lines["worktree"])
        repo.git.worktree("prune")
        for head in list(repo.heads):
            if head.name.startswith("ladder/attempt-"):
                if repo.head.is_detached is False and repo.active_branch.name == head.name:
                    raise LadderError(f"the source checkout is on {head.name}", "check out your own branch first")
                repo.git.branch("-D", head.name)
                out["branches_deleted"].append(head.name)
        for tag in list(repo.tags):
            if tag.name == f"{git_ops.HEAD_TAG}/{spec.name}":  # keep the archived journal's anchor, renamed
                repo.git.tag(f"{tag.name}-archived-{stamp}", tag.name)
                repo.git.tag("-d", tag.name)
    moves = [spec.journal_dir] + ([] if keep_baseline else [spec.baselines_dir])
    for src in moves:
        if src.exists():
            dst = src.parent / ".archive" / f"{src.name}-{stamp}"
            dst.parent.mkdir(parents=True, exist_ok=True)
            shutil.move(str(src), str(dst))
            out["archived"].append(str(dst))
    wt_root = git_ops.worktree_path(spec.workspace, 0).parent
    if wt_root.exists():
        shutil.rmtree(wt_root, ignore_errors=True)
    return out
