"""`ladder grade`: the XStack grading of a finished migration, journaled.

Stage 1: the final attempt's branch is cloned without history, its environment built from its own setup
file, and the full experiment run (ladder.grade.rerun); the ladder's L0 checks, L3 main_result against the
baseline's band and, with [parity] export and evaluate, weights_load_back judge it; the rule-based judges
(ladder.grade.integrity) look for a number obtained the wrong way; an optional LLM judge reads what rules
cannot. Stage 2: the frozen code's second chance, where only the protocol's allowed paths may differ from
the stage-1 commit; anything else is refused before any run.

Owns: the order of the stages, the outcome (pass or one of XStack's failure classes) and the grade entry.
Must not: change the migration (its branches, worktrees, journal entries other than its own).
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ladder._util.errors import LadderError
from ladder._util.hashing import manifest_digest
from ladder.baselines.store import pinned, require_intact
from ladder.checks import CheckContext, run_ladder
from ladder.checks.results import CheckResult
from ladder.grade import integrity, rerun
from ladder.journal import entries as je
from ladder.journal.entries import JudgeVerdict
from ladder.journal.store import Journal
from ladder.migration.spec import Spec, load_spec_protocol
from ladder.parity.runs import exported_weights, run_load_back
from ladder.runs.execute import execute_run

# XStack's failure classes, in the order the outcome is decided (the first that applies).
OUTCOMES = ("freeze_broken", "crash", "rejected", "fidelity_gap", "undecided", "rejected_by_judge", "pass")
REJECTING = ("files_outside", "eval_split", "metric_literal", "metric_without_eval", "frozen_code_rewritten",
             "weights_load_back")


@dataclass
class GradeReport:
    stage: str
    branch: str
    commit: str
    outcome: str = "pass"
    checks: list[CheckResult] = field(default_factory=list)
    judge: JudgeVerdict | None = None
    dir: Path | None = None
    rerun_dir: Path | None = None

    def as_dict(self) -> dict[str, Any]:
        return {"stage": self.stage, "branch": self.branch, "commit": self.commit, "outcome": self.outcome,
                "dir": str(self.dir) if self.dir else None,
                "rerun_dir": str(self.rerun_dir) if self.rerun_dir else None,
                "checks": [c.model_dump(mode="json") for c in self.checks],
                "judge": self.judge.model_dump() if self.judge else None}


def journal_of(spec: Spec) -> Journal:
    spec.journal_dir.mkdir(parents=True, exist_ok=True)
    return Journal(spec.journal_dir / "journal.sqlite")


def final_attempt(journal: Journal) -> tuple[int, str, str]:
    """(attempt, branch, commit) of the migration's best attempt: the highest achieved level, the latest on a tie."""
    from ladder.checks.results import level_index

    results = [e for e in journal.entries("attempt_result") if e.attempt is not None]
    if not results:
        raise LadderError("the journal has no judged attempt to grade", "pass --branch with the port's branch")
    best = max(results, key=lambda e: (level_index(e.content.get("achieved_level")), e.seq))
    attempt = journal.last("attempt", attempt=best.attempt)
    return best.attempt, attempt.content["branch"], attempt.content["commit"]


def diff_base(journal: Journal | None) -> str:
    """The original code: attempt 0's commit when the migration recorded one, else the source's HEAD."""
    a0 = journal.last("attempt", attempt=0) if journal is not None else None
    return a0.content["commit"] if a0 is not None else "HEAD"


def forbidden_roots(spec: Spec, baseline: Any) -> list[Path]:
    """What a run must never open: other runs, the baselines, the journals, the hidden target."""
    ws = spec.workspace.resolve()
    roots = [ws / "runs", ws / "baselines", ws / "journals", spec.baselines_dir.resolve()]
    from ladder.checks.l3 import hidden_target_path

    if baseline is not None:
        ctx = CheckContext(run=None, protocol=load_spec_protocol(spec), baseline=baseline)  # type: ignore[arg-type]
        target = hidden_target_path(ctx)
        if target is not None:
            roots.append(target.resolve())
    return roots


def _outcome(report: GradeReport) -> str:
    by_name = {c.name: c for c in report.checks}
    failed = {c.name for c in report.checks if c.status == "failed"}
    if "stage2_freeze" in failed:
        return "freeze_broken"
    if any(c.level == "L0" and c.status != "passed" for c in report.checks) or "setup" in failed:
        return "crash"
    if failed & set(REJECTING):
        return "rejected"
    main = by_name.get("main_result")
    if main is None or main.status in ("failed", "not_checked"):
        return "fidelity_gap"
    if main.status == "undecided":
        return "undecided"
    if report.judge is not None and report.judge.verdict == "reject":
        return "rejected_by_judge"
    return "pass"


def _judge_evidence(spec: Spec, report: GradeReport, run: Any, diff: str) -> dict[str, Any]:
    return {"migration": spec.name, "metric_name": spec.parse.metric_name, "direction": spec.parse.direction,
            "metric": run.metric if run else None, "full_command": spec.experiment.full,
            "rule_checks": [{"check": c.name, "status": c.status, "evidence": c.evidence} for c in report.checks],
            "evaluation_lines": [e.model_dump() for e in (run.evals if run else [])][:20],
            "last_log_lines": list(run.last_lines)[-30:] if run else [], "diff": diff}


def _stage2_guard(spec: Spec, journal: Journal, repo: Path, commit: str) -> CheckResult:
    frozen = next((e for e in reversed(journal.entries("grade")) if e.content.get("stage") == "stage1"), None)
    if frozen is None:
        raise LadderError("no stage-1 grade to freeze: stage 2 compares with the code graded in stage 1",
                          "run `ladder grade` (stage 1) first")
    allowed = load_spec_protocol(spec).grade.stage2_allowed
    entry = spec.grade.entry if spec.grade else "train.py"
    changed = rerun.changed_paths(repo, frozen.content["commit"], commit)
    refused = rerun.stage2_refusals(changed, allowed, entry)
    patterns = [a.replace("{entry}", entry) for a in allowed]
    return CheckResult(level="L3", name="stage2_freeze", status="failed" if refused else "passed",
                       measured=refused, threshold=patterns, details={"frozen": frozen.content["commit"],
                                                                      "changed": changed},
                       evidence=(f"the frozen code changed outside {patterns}: {', '.join(refused)}" if refused
                                 else f"changed since stage 1 ({frozen.content['commit'][:10]}): "
                                      f"{', '.join(changed) or 'nothing'}; all allowed"))


def _new_dir(parent: Path, name: str) -> Path:
    path, n = parent / name, 1
    while path.exists():
        n += 1
        path = parent / f"{name}-{n}"
    path.mkdir(parents=True)
    return path


def grade(spec: Spec, *, stage: str = "stage1", branch: str | None = None, judge: bool = False,
          client: Any | None = None, progress: Any = None) -> GradeReport:
    """Grade the migration's final attempt (or `branch`); the report is also appended to its journal."""
    if spec.grade is None:
        raise LadderError(f"{spec.path} has no [grade] table",
                          "add [grade] with setup = \"setup_env.sh\" (or a requirements file) of the port")
    repo = spec.source_dir
    with journal_of(spec) as journal:
        attempt = None
        if branch is None:
            attempt, branch, _ = final_attempt(journal)
        out = _new_dir(spec.journal_dir / "grade", f"{stage}-{time.strftime('%Y%m%d-%H%M%S')}")
        commit = rerun.clone_branch(repo, branch, out / "port")
        report = GradeReport(stage=stage, branch=branch, commit=commit, dir=out)
        if stage == "stage2":
            report.checks.append(_stage2_guard(spec, journal, repo, commit))
        if not report.checks or report.checks[-1].status == "passed":
            _rerun_and_judge(spec, report, journal, judge, client, progress)
        shutil.rmtree(out / "port", ignore_errors=True)
        report.outcome = _outcome(report)
        refs = [je.Ref(path=je.ref_path(report.rerun_dir, spec.workspace), digest=manifest_digest(report.rerun_dir))
                ] if report.rerun_dir else []
        je.append(journal, je.GradeEntry(stage=stage, branch=branch, commit=commit,  # type: ignore[arg-type]
                                         outcome=report.outcome, judge=report.judge, refs=refs,
                                         checks=[c.model_dump(mode="json") for c in report.checks]),
                  author="ladder", attempt=attempt)
    return report


def _rerun_and_judge(spec: Spec, report: GradeReport, journal: Journal, judge: bool, client: Any,
                     progress: Any) -> None:
    """The fresh re-run of the cloned port and every judge of it, appended to the report's checks."""
    protocol = load_spec_protocol(spec)
    repo = spec.source_dir
    out = report.dir
    try:
        env = rerun.setup_environment(out / "port" / spec.grade.setup)
    except LadderError as e:
        report.checks.append(CheckResult(level="L0", name="setup", status="failed",
                                         evidence=f"the port's own setup file does not build: {e}"))
        return
    run_dir = out / "rerun"
    run = execute_run(spec, "target", "full", seed=0, source=out / "port", run_dir=run_dir, progress=progress,
                      environment=env)
    shutil.rmtree(run_dir / "work", ignore_errors=True)
    report.rerun_dir = run_dir
    baseline, _ = pinned(spec, journal.path)
    if baseline is not None:
        require_intact(baseline)
    options: dict[str, Any] = {"run_dir": str(run_dir)}
    if spec.parity and spec.parity.export and spec.parity.evaluate:
        weights = exported_weights(spec, run_dir)
        options["load_back"] = {"dir": None, "why": f"the re-run exported no {spec.parity.export}"}
        if weights is not None:
            run_load_back(spec, weights, out / "load-back", progress)
            options["load_back"] = {"dir": str(out / "load-back")}
    ctx = CheckContext(run=run, protocol=protocol, baseline=baseline,
                       expected_platform=spec.profile("target").platform, full_run=run, options=options)
    ladder = run_ladder(ctx, up_to="L3")
    report.checks += [c for c in ladder.checks if c.level == "L0" or c.name in ("main_result", "weights_load_back")]
    diff = rerun.diff_text(repo, diff_base(journal), report.commit)
    report.checks += [
        integrity.files_outside(run, run_dir, forbidden_roots(spec, baseline)),
        integrity.eval_split(run, spec.grade.test_split, spec.grade.train_split),
        integrity.metric_literal(diff, run.metric, protocol.grade.metric_literal_digits),
        integrity.metric_without_eval(run, spec.parse.eval is not None),
    ]
    if report.stage == "stage2":
        report.checks.append(integrity.frozen_code_rewritten(run))
    if judge or client is not None:
        from ladder.grade.judge import llm_judge

        report.judge = llm_judge(protocol.grade, _judge_evidence(spec, report, run, diff), client)
