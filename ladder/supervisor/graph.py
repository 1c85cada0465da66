"""The supervisor's LangGraph: baseline -> attempt 0 -> (agent -> declare -> short run -> checks ->
stop rules)* -> full run -> L3/L4 -> report.

State is a small cursor (attempt numbers, raised limits, the last decision); facts live in the
journal. Stop rules pause the graph with `interrupt()`; `ladder resume --decision ...` answers with
`Command(resume=...)`. The checkpointer is SQLite in journals/<name>/, thread id = migration name.
"""

from __future__ import annotations

import sqlite3
import time
from typing import Any, TypedDict

from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.types import Command, interrupt
from langchain_core.runnables import RunnableConfig

from ladder._util.errors import LadderError
from ladder.agents import Agent, make_agent
from ladder.journal import entries as je
from ladder.checks.results import highest_level
from ladder.baselines.store import Baseline
from ladder.supervisor import git_ops, steps
from ladder.supervisor.steps import Migration

DECISIONS = ("continue", "stop", "accept", "raise-limit")


class State(TypedDict, total=False):
    spec_path: str
    agent: str
    max_attempts: int
    seeds: int
    full_seeds: int
    attempt: int
    parent: int
    best: int | None  # the attempt whose short run reached L2, taken to the full run
    limits: dict[str, float]  # limits raised by a human at a pause
    pause: dict[str, Any] | None
    decision: str | None
    finished: str | None  # why the migration ended


def _cfg(config: RunnableConfig) -> dict[str, Any]:
    return (config or {}).get("configurable", {})


def _migration(state: State, config: RunnableConfig) -> Migration:
    cached = _cfg(config).get("migration")
    return cached if cached is not None else steps.open_migration(state["spec_path"])


def _agent(state: State, config: RunnableConfig, m: Migration) -> Agent:
    return _cfg(config).get("agent_obj") or make_agent(state["agent"], m.workspace, m.protocol)


def _baseline(m: Migration) -> Baseline:
    return steps.pinned_baseline(m)


def node_setup(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    steps.ensure_migration(m, state["agent"])
    steps.ensure_baseline(m, state.get("seeds", 1), state.get("full_seeds", 1), _cfg(config).get("progress"))
    return {"attempt": 0, "parent": 0, "limits": state.get("limits") or {}, "best": None}


def node_attempt0(state: State, config: RunnableConfig) -> dict[str, Any]:
    steps.ensure_attempt0(_migration(state, config))
    return {}


def node_agent(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    n = state["attempt"]
    if state["agent"] == "human":
        return _human_step(m, n, state["parent"])
    agent = _agent(state, config, m)
    planned = getattr(agent, "attempts", None)
    if planned is not None and n > planned() and steps.attempt_entry(m, n) is None:
        return {"finished": f"the scripted agent has no attempt {n} (it recorded {planned()})"}
    steps.run_agent_step(m, n, state["parent"], agent, _baseline(m))
    rejected = steps.rejection(m, n)
    if rejected is not None:
        steps.record_rejected_attempt(m, n, *rejected)
    return {}


def _human_step(m: Migration, n: int, parent: int) -> dict[str, Any]:
    if steps.declaration(m, n) is not None and steps.attempt_entry(m, n) is not None:
        return {}
    repo = git_ops.open_repo(m.spec.source_dir)
    wt = git_ops.worktree_path(m.workspace, n)
    parent_entry = steps.attempt_entry(m, parent)
    base = parent_entry.content["commit"]
    if not wt.exists():
        git_ops.fresh_worktree(repo, m.workspace, n, base)
    interrupt({"waiting_for": "human", "attempt": n, "worktree": str(wt), "branch": git_ops.branch_name(n),
               "how": f"edit and commit in {wt}, then `ladder declare LEVEL --attempt {n} -m WHY` "
                      f"and `ladder resume`"})
    decl = steps.declaration(m, n)
    if decl is None:
        raise LadderError(f"attempt {n} has no declared level", f"run `ladder declare LEVEL --attempt {n} -m WHY` first")
    if git_ops.uncommitted(wt):
        git_ops.commit_attempt(wt, n, decl.content.get("level"), "human change (committed by ladder)",
                               journal_head=m.journal.head())
    import git

    sha = git.Repo(wt).head.commit.hexsha
    touched = git_ops.protected_changes(git_ops.changed_paths(repo, base, sha))
    je.append(m.journal, je.AttemptEntry(
        number=n, parent=parent, branch=git_ops.branch_name(n), commit=sha, diff_stat=repo.git.diff("--stat", base, sha),
        summary=decl.content.get("rationale", ""), agent="human", worktree=m.rel(wt), started_at=time.time(),
        protected_changes=touched), author="human", attempt=n)
    if touched:
        steps.record_rejected_attempt(m, n, "protected", f"the change touched protected paths: {touched}")
    return {}


def node_short_run(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    n = state["attempt"]
    rejected = steps.rejection(m, n)
    if rejected is not None:  # never run, whatever was recorded before a kill
        steps.record_rejected_attempt(m, n, *rejected)
        return {}
    if m.journal.last("attempt_result", attempt=n) is None:
        steps.ensure_run(m, n, "short", _cfg(config).get("progress"))
    return {}


def node_checks(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    n = state["attempt"]
    if steps.rejection(m, n) is not None or not steps._run_entries(m, n, "short"):
        return {}
    out = steps.ensure_checks(m, n, "short", _baseline(m), _cfg(config).get("progress"))
    return {"best": n} if steps.reaches(out["achieved"], "L2") else {}


def after_checks(state: State) -> str:
    return "full_run" if state.get("best") == state["attempt"] else "stop_rules"


def node_stop_rules(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    n = state["attempt"]
    from ladder.supervisor.rules import evaluate

    decision = evaluate(m, n, state)
    if decision is None:
        if n >= state.get("max_attempts", 10**9):
            return {"finished": f"reached --max-attempts {state['max_attempts']}", "decision": "stop"}
        return {"decision": "continue", "pause": None}
    payload = {"rule": decision["rule"], "reason": decision["reason"], "evidence": decision.get("evidence", {}),
               "attempt": n, "choices": list(DECISIONS),
               # what raise-limit would raise, and to what by default: the human needs it to answer
               **{k: decision[k] for k in ("limit_key", "raised_default") if k in decision}}
    replay = _cfg(config).get("auto_decision")
    answer = replay(n, payload) if replay else None
    if answer is None:
        answer = interrupt(payload)
    if isinstance(answer, str):
        answer = {"decision": answer}
    choice = answer.get("decision")
    if choice not in DECISIONS:
        raise LadderError(f"unknown decision {choice!r}", f"use one of {', '.join(DECISIONS)}")
    je.append_decision(m.journal, rule=decision["rule"], reason=decision["reason"], decision=choice,
                       by=answer.get("by", "human"), attempt=n, note=answer.get("note", ""),
                       raise_to=answer.get("raise"))
    update: dict[str, Any] = {"decision": choice, "pause": None}
    if choice == "raise-limit":
        limits = dict(state.get("limits") or {})
        key = decision.get("limit_key")
        if key:
            limits[key] = float(answer.get("raise") or decision.get("raised_default") or 0)
        update["limits"] = limits
    elif choice == "accept":
        update["best"] = n
    elif choice == "stop":
        update["finished"] = f"stopped by a human at attempt {n}: {decision['reason']}"
    return update


def after_stop_rules(state: State) -> str:
    d = state.get("decision")
    if d == "stop" or state.get("finished"):
        return "report"
    if d == "accept":
        return "full_run"
    return "next_attempt"


def node_next_attempt(state: State, config: RunnableConfig) -> dict[str, Any]:
    return {"parent": state["attempt"], "attempt": state["attempt"] + 1, "decision": None}


def node_full_run(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    n = state["best"]
    from ladder.supervisor.rules import full_run_estimate

    already = [e for e in m.journal.entries("decision", attempt=n) if e.content.get("rule") == "full_run_estimate"]
    est = None if already else full_run_estimate(m, n, state)
    if est is not None:
        replay = _cfg(config).get("auto_decision")
        payload = {**est, "attempt": n, "choices": list(DECISIONS)}
        answer = (replay(n, payload) if replay else None) or interrupt(payload)
        choice = answer.get("decision") if isinstance(answer, dict) else answer
        if choice not in DECISIONS:
            raise LadderError(f"unknown decision {choice!r}", f"use one of {', '.join(DECISIONS)}")
        je.append_decision(m.journal, rule=est["rule"], reason=est["reason"], decision=choice,
                           by=answer.get("by", "human") if isinstance(answer, dict) else "human", attempt=n)
        already = [m.journal.last("decision", attempt=n)]
    if already and already[-1].content.get("decision") == "stop":
        return {"finished": f"full run of attempt {n} not started: {already[-1].content.get('reason')}"}
    if already and already[-1].content.get("decision") == "continue":  # look for a cheaper attempt instead
        return {"best": None, "decision": "continue"}
    steps.ensure_run(m, n, "full", _cfg(config).get("progress"))
    return {}


def after_full_run(state: State) -> str:
    if state.get("finished"):
        return "report"
    return "final_checks" if state.get("best") is not None else "next_attempt"


def node_final_checks(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    n = state["best"]
    out = steps.ensure_checks(m, n, "full", _baseline(m), _cfg(config).get("progress"))
    if steps.reaches(out["achieved"], "L3"):
        return {"finished": f"attempt {n} reached {out['achieved']} on the full run"}
    return {"best": None, "attempt": max(state["attempt"], n)}


def after_final_checks(state: State) -> str:
    return "report" if state.get("finished") else "stop_rules"


def node_report(state: State, config: RunnableConfig) -> dict[str, Any]:
    m = _migration(state, config)
    if m.journal.last("stop") is None:
        best = highest_level(e.content.get("achieved_level") for e in m.journal.entries("attempt_result"))
        je.append_stop(m.journal, reason=state.get("finished") or "ended", final_level=best)
    from ladder.supervisor.rules import write_report

    head = m.journal.head()
    if head is not None:  # the tail's anchor: the journal's last entry, outside the journal
        git_ops.anchor_tag(git_ops.open_repo(m.spec.source_dir), m.spec.name, head)
    write_report(m)
    return {}


def build_graph() -> StateGraph:
    g = StateGraph(State)
    for name, fn in [("setup", node_setup), ("attempt0", node_attempt0), ("agent", node_agent),
                     ("short_run", node_short_run), ("checks", node_checks), ("stop_rules", node_stop_rules),
                     ("next_attempt", node_next_attempt), ("full_run", node_full_run),
                     ("final_checks", node_final_checks), ("report", node_report)]:
        g.add_node(name, fn)
    g.add_edge(START, "setup")
    g.add_edge("setup", "attempt0")
    g.add_edge("attempt0", "short_run")
    g.add_conditional_edges("agent", lambda s: "report" if s.get("finished") else "short_run",
                            ["report", "short_run"])
    g.add_edge("short_run", "checks")
    g.add_conditional_edges("checks", after_checks, ["full_run", "stop_rules"])
    g.add_conditional_edges("stop_rules", after_stop_rules, ["report", "full_run", "next_attempt"])
    g.add_edge("next_attempt", "agent")
    g.add_conditional_edges("full_run", after_full_run, ["report", "final_checks", "next_attempt"])
    g.add_conditional_edges("final_checks", after_final_checks, ["report", "stop_rules"])
    g.add_edge("report", END)
    return g


def compiled(m: Migration):
    path = steps.checkpoint_path(m.spec)
    path.parent.mkdir(parents=True, exist_ok=True)
    conn = sqlite3.connect(str(path), check_same_thread=False)
    return build_graph().compile(checkpointer=SqliteSaver(conn))


def thread(m: Migration, **configurable: Any) -> RunnableConfig:
    return {"configurable": {"thread_id": m.spec.name, "migration": m, **configurable}, "recursion_limit": 1000}


def resume_command(decision: str | None, **extra: Any) -> Command | None:
    return None if decision is None else Command(resume={"decision": decision, **extra})
