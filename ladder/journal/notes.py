"""Failure notes: one per failed check, drafted from the check's evidence, silent failures included.

A note says which check failed with the measured value against the threshold (cause), what the
evidence means (diagnosis, from rules keyed on the check's `details`, falling back to its evidence
text), and whether the failure was silent (the process exited 0 and printed no error line). The fix
stays empty: the next attempt or a human fills it by appending a note_fix entry.

An optional pass with the Anthropic SDK rewrites the diagnosis in plain words; the rewrite is stored
beside the rule-based draft (`diagnosis_llm`), never in its place. Without an API key it is skipped.
Drafting never touches the journal; `record_checked_run` is the one helper that appends. Nothing prints.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ladder.journal.entries import FailureNote, ref_path
from ladder.runs.records import RunRecord
from ladder.checks.results import CheckResult, LadderResult

if TYPE_CHECKING:
    from ladder.journal.store import Entry, Journal

__all__ = ["FailureNote", "draft_notes", "is_silent", "record_checked_run", "rewrite_diagnoses", "LLM_MODEL"]

LLM_MODEL = os.environ.get("LADDER_NOTES_MODEL", "claude-sonnet-4-6")
LLM_MAX_TOKENS = 400
_EXCEPTION_LINE = re.compile(r"^\s*(?:[\w.]+\.)?\w*(?:Error|Exception|Interrupt|Exit)\b(?::|$)")
# a native abort: glog/absl's fatal line (`F1202 08:44:30.2 ... file.cc:161] why`), a failed CHECK, a C++ terminate
_NATIVE_FATAL = re.compile(r"^\s*(?:F\d{4} \S+\s+\d+ \S+\] .+|Fatal Python error: .+|.*Check failed: .+|terminate called .+)")


def is_silent(run: RunRecord) -> bool:
    """The failure left no trace a person would notice: exit 0, no error line, not killed."""
    return run.exit_code == 0 and not run.error_lines and not run.timed_out and not run.killed


def _fmt(v: Any) -> str:
    if isinstance(v, float):
        return f"{v:.6g}"
    if isinstance(v, (dict, list)):
        text = json.dumps(v, default=str, separators=(", ", ": "))
        return text if len(text) <= 200 else text[:197] + "..."
    return str(v)


def cause_of(check: CheckResult) -> str:
    text = f"{check.level}/{check.name} failed"
    band = check.threshold if isinstance(check.threshold, dict) else {}
    if isinstance(check.measured, (int, float)) and {"lo", "hi"} <= band.keys():
        from ladder.report.words import band_text

        return text + ": measured " + band_text(float(check.measured), band["lo"], band["hi"], band.get("seeds"))
    if check.measured is not None or check.threshold is not None:
        text += f": measured {_fmt(check.measured)} vs threshold {_fmt(check.threshold)}"
    return text


def error_line(run: RunRecord) -> str | None:
    """The line naming the exception (the last `XxxError: ...` line), else the first error line."""
    for line in reversed(run.last_lines):
        if _EXCEPTION_LINE.match(line):
            return line.strip()
    for line in reversed(run.error_lines):
        if _EXCEPTION_LINE.match(line):
            return line.strip()
    return run.error_lines[0].strip() if run.error_lines else None


# ------------------------------------------------------------------ rules, one per check name

def _finished(c: CheckResult, run: RunRecord) -> str:
    if run.ended_at is None:
        return "the run never finished: ladder was stopped while it ran, so there is no exit code"
    if run.timed_out:
        tail = run.last_lines[-1].strip() if run.last_lines else "no output"
        return (f"the run was killed after {run.timeout_s:.0f}s without finishing (a hang or a far slower "
                f"port); its last line was: {tail}")
    fatal = next((x.strip() for x in run.last_lines + run.error_lines if _NATIVE_FATAL.match(x)), None)
    if run.killed and not fatal:
        return f"the process was killed by a signal from outside (exit code {run.exit_code}): out of memory?"
    line = error_line(run)
    if line:
        return f"the process crashed with exit code {run.exit_code}: {line}"
    if fatal:
        why = f"the process aborted in native code (exit code {run.exit_code}): {fatal[:300]}"
        if "rendezvous" in fatal.lower() and "timeout" in fatal.lower():
            why += (" -- a collective waited for devices that never arrived: with fake CPU devices, threads "
                    "starved on a loaded machine (rerun with fewer runs at once); on accelerators, a rank "
                    "that died or took another branch")
        return why
    tail = run.last_lines[-1].strip() if run.last_lines else "no output"
    return f"the process exited with code {run.exit_code} without an error line; its last line was: {tail}"


def _loss_logged(c: CheckResult, run: RunRecord) -> str:
    if run.line_count == 0:
        return "the run printed nothing, so no loss could be read"
    return ("the [parse].loss pattern matched none of the "
            f"{run.line_count} output lines: the port changed its log format, or training never started")


def _metric_reported(c: CheckResult, run: RunRecord) -> str:
    return (f"no headline metric {run.metric_name!r} was printed: the final evaluation did not run "
            "or prints in another format")


def _finite_loss(c: CheckResult, run: RunRecord) -> str:
    bad = run.nonfinite_losses
    if not bad:
        return c.evidence
    return (f"the loss became {bad[0].loss} at step {bad[0].step} ({len(bad)} non-finite loss lines): "
            "an overflow, a division by zero or a log of zero in the port")


def _loss_window(c: CheckResult, run: RunRecord) -> str:
    f = c.details.get("fixed_rule") or {}
    mine, base = f.get("run"), f.get("baseline")
    if not isinstance(mine, (int, float)) or not isinstance(base, (int, float)) or base == 0:
        return c.evidence
    rel = (mine - base) / abs(base)
    way = "higher" if rel > 0 else "lower"
    meaning = ("the port learns less or optimises a different objective" if rel > 0 else
               "the port reaches a lower loss than the reference: a changed loss, data or optimiser, not a win")
    return (f"the mean loss over the last steps is {abs(rel):.1%} {way} than the baseline's "
            f"({mine:.5g} vs {base:.5g}): {meaning}")


def _metric(c: CheckResult, run: RunRecord) -> str:
    f = c.details.get("fixed_rule") or {}
    mine, base = f.get("run"), f.get("baseline")
    if not isinstance(mine, (int, float)) or not isinstance(base, (int, float)) or base == 0:
        return c.evidence
    rel = (mine - base) / abs(base)
    better = (rel > 0) == (run.metric_direction == "max")
    return (f"{run.metric_name or 'the metric'} moved {'up' if rel > 0 else 'down'} by {abs(rel):.2%} "
            f"({mine:.5g} vs the baseline's {base:.5g}), {'better' if better else 'worse'} than the reference: "
            + ("a silent fault can improve a metric; a different computation is the finding"
               if better else "the port computes something else or learns less"))


def _trend(c: CheckResult, run: RunRecord) -> str:
    cal = c.details.get("calibrated") or {}
    gn = (cal.get("details") or {}).get("grad_norm") or {}
    loss_blocks = (cal.get("band") or {}).get("blocks") or []
    if gn.get("passed") is False and not any(b.get("status") == "failed" for b in loss_blocks):
        blocks = (gn.get("band") or {}).get("blocks") or []
        if not blocks:
            return f"the gradient the optimizer receives is not finite: {gn.get('why', c.evidence)}"
        w = max(blocks, key=lambda b: b.get("z", 0.0))
        rel = (w["value"] - w["mean"]) / abs(w["mean"]) if w.get("mean") else 0.0
        return (f"the loss curve is within noise, but the gradient the optimizer receives is "
                f"{'smaller' if rel < 0 else 'larger'} by {abs(rel):.0%} than the baseline seeds' ({w['value']:.4g} "
                f"vs {w['mean']:.4g} in its worst block): a fault on the gradient path (clipping per shard, "
                "loss scaling or averaging) that the optimizer's normalisation may hide from the loss")
    f = c.details.get("fixed_rule") or {}
    rm, bm = f.get("run_moves") or [], f.get("base_moves") or []
    if not rm or len(rm) != len(bm):
        return f"the loss trend differs from the baseline's: {c.evidence}"
    i = max(range(len(rm)), key=lambda k: abs(rm[k] - bm[k]))
    return (f"the loss trend differs from the baseline's between windows {i + 1} and {i + 2}: the run's loss "
            f"moved {rm[i]:+.1%}, the baseline's {bm[i]:+.1%} (fraction of the baseline's first window): "
            + ("the run diverges or stops learning" if rm[i] > bm[i] else "the run falls faster than the reference"))


def _platform(c: CheckResult, run: RunRecord) -> str:
    seen = c.measured if isinstance(c.measured, dict) else {}
    # The xla list names the PJRT device (CPU is fine there); only torch/jax placement on cpu is a fallback.
    if "CPU fallback" in c.evidence or "cpu" in (seen.get("torch") or []) or "cpu" in (seen.get("jax") or []):
        return (f"the computation ran on the CPU instead of {c.threshold}: {c.evidence}. The model or inputs "
                "were never moved to the device (a hard-coded device string or a missing .to(device))")
    return f"the computation did not run where expected ({c.threshold}): {c.evidence}"


def _cpu_fallback(c: CheckResult, run: RunRecord) -> str:
    ops = c.details.get("fallback") or (c.measured if isinstance(c.measured, dict) else {})
    if not ops:
        return f"ops ran on the CPU: {c.evidence}"
    parts = [f"`{op}` ran {n} times" for op, n in sorted(ops.items(), key=lambda kv: -kv[1])]
    them = "the op is not lowered to XLA and runs" if len(parts) == 1 else "these ops are not lowered to XLA and run"
    return (f"{'; '.join(parts[:5])}{'; ...' if len(parts) > 5 else ''}: {them} on the CPU, "
            "with a device-to-host copy each time")


def _recompilation(c: CheckResult, run: RunRecord) -> str:
    procs = c.details.get("processes") or []
    steps = sorted({s for p in procs for s in p.get("second_half_steps") or []})
    ref = (c.threshold or {}).get("reference_late_compile_steps") if isinstance(c.threshold, dict) else None
    where = (f"new graphs at steps {', '.join(map(str, steps[:6]))}{'...' if len(steps) > 6 else ''} of the "
             f"second half of training" if steps else "new graphs late in training")
    against = f" (the reference: {ref} such steps)" if ref is not None else ""
    if "torch.compile gave up" in c.evidence:
        return (f"{where}{against}; torch.compile hit its recompile limit and ran the function eagerly: a value "
                f"the guards depend on changes between steps ({c.evidence})")
    if "jax" in ((run.probe or {}).get("frameworks") or {}):
        return f"{where}{against}: JAX traced the step again because shapes or static arguments change per step"
    return (f"{where}{against}: shapes change per step (a variable batch or sequence length, or a Python value "
            "baked into the graph)")


def _host_syncs(c: CheckResult, run: RunRecord) -> str:
    return (f"{_fmt(c.measured)} transfers from the device per step against at most {_fmt(c.threshold)}: "
            ".item(), .tolist(), float() or printing a device tensor inside the step forces the host to wait "
            f"for the device ({c.evidence})")


def _numerics(c: CheckResult, run: RunRecord) -> str:
    m = c.measured if isinstance(c.measured, dict) else {}
    if m.get("frozen_updates") and not any(m.get(k) for k in ("nonfinite_losses", "nonfinite_params",
                                                              "nonfinite_grad_norms", "skipped_steps")):
        return (f"updates dropped: {c.evidence}; the training saw fewer batches than the reference, which "
                "the logged loss does not show")
    return f"non-finite values: {c.evidence}; an overflow (e.g. lower precision on the device) or a masked NaN step"


def _evaluation_complete(c: CheckResult, run: RunRecord) -> str:
    m, t = c.measured if isinstance(c.measured, dict) else {}, c.threshold if isinstance(c.threshold, dict) else {}
    if m.get("events") is not None and t.get("events") is not None and m["events"] != t["events"]:
        return (f"{m['events']} evaluation events against the baseline's {t['events']}: part of the evaluation "
                "was skipped, so the metric is not comparable")
    return f"the evaluation covered fewer or other items than the baseline's: {c.evidence}"


def _optimizer_unchanged(c: CheckResult, run: RunRecord) -> str:
    diffs = c.details.get("diff") or []
    what = "; ".join(map(str, diffs[:5])) if diffs else c.evidence
    return f"the optimisation changed: {what}. The port must keep the reference optimiser and hyperparameters"


RULES: dict[str, Callable[[CheckResult, RunRecord], str]] = {
    "finished": _finished,
    "loss_logged": _loss_logged,
    "metric_reported": _metric_reported,
    "finite_loss": _finite_loss,
    "loss_window": _loss_window,
    "metric": _metric,
    "trend": _trend,
    "platform": _platform,
    "cpu_fallback": _cpu_fallback,
    "recompilation": _recompilation,
    "host_syncs": _host_syncs,
    "numerics": _numerics,
    "evaluation_complete": _evaluation_complete,
    "optimizer_unchanged": _optimizer_unchanged,
}


def diagnose(check: CheckResult, run: RunRecord) -> str:
    rule = RULES.get(check.name)
    if rule is None:
        return check.evidence or f"{check.level}/{check.name} failed without evidence"
    try:
        return rule(check, run)
    except (KeyError, TypeError, ValueError, AttributeError):
        # A check whose details changed shape must still get a note: the evidence is the fallback.
        return check.evidence or f"{check.level}/{check.name} failed"


def draft_notes(result: LadderResult, run: RunRecord) -> list[FailureNote]:
    """One note per failed check of the run, in ladder order; fix left empty. A run the infrastructure failed
    gets one note, of its own kind, and none of the port's: its missing output is the machine's doing."""
    if run.infrastructure is not None:
        kind = run.infrastructure.kind
        return [FailureNote(check=f"infrastructure/{kind}", level="L0", cause=f"infrastructure failure: {kind} "
                            f"(the {run.runner} runner), not a failure of the code under test",
                            diagnosis=run.infrastructure.detail, silent=False, run_dir=result.run_dir)]
    silent = is_silent(run)
    # When the run did not finish, the later failures (no metric, a short curve) follow from that:
    # say so, so that a reviewer fixes the crash first rather than chasing its echoes.
    unfinished = any(c.name == "finished" and c.status == "failed" for c in result.checks)
    notes = []
    for c in result.checks:
        if c.status != "failed":
            continue
        diagnosis = diagnose(c, run)
        if unfinished and c.name != "finished":
            diagnosis = f"the run did not finish (see L0/finished), which may explain this: {diagnosis}"
        notes.append(FailureNote(check=f"{c.level}/{c.name}", level=c.level, cause=cause_of(c),
                                 diagnosis=diagnosis, silent=silent, run_dir=result.run_dir))
    notes += findings(result)
    return notes


def findings(result: LadderResult) -> list[FailureNote]:
    """Differences that fail no level but a reviewer should know: the initialisation (the first logged loss
    beyond the seeds' spread) when the curves and metric are otherwise judged on their own."""
    out = []
    for c in result.checks:
        init = (((c.details or {}).get("calibrated") or {}).get("details") or {}).get("initialisation")
        if init and init.get("differs"):
            lo, hi = init["band"]
            out.append(FailureNote(
                check="L1/initialisation", level="L1", finding=True, silent=True, run_dir=result.run_dir,
                cause=(f"the initialisation differs: first logged loss {init['run']:.5g} at step {init['step']} vs the "
                       f"seeds' {init['seeds_mean']:.5g} (band {lo:.5g}-{hi:.5g}, {init['seeds']} seeds)"),
                diagnosis=("another init distribution (a framework's default, a different scale) or a different "
                           "model at step 0; a finding, not a failure: the level depends on whether the curves and "
                           "the metric also differ beyond noise (L1/trend, L1/loss_window, L1/metric)")))
    return out


# ------------------------------------------------------------------ optional plain-words rewrite

_PROMPT = """You review failure notes from a tool that checks a machine-learning training program ported \
to new hardware. Rewrite the diagnosis below in two or three plain sentences for an engineer: what went \
wrong and what to look at first. Keep every number. Do not invent facts that are not in the note.

Check: {check}
Cause: {cause}
Diagnosis: {diagnosis}
The process {silent}."""


def rewrite_diagnoses(notes: list[FailureNote], client: Any | None = None,
                      model: str = LLM_MODEL) -> tuple[list[FailureNote], list[str]]:
    """Notes with `diagnosis_llm` filled by the Anthropic API, and the problems met.

    Without a client and without ANTHROPIC_API_KEY the notes come back unchanged and no problem is
    reported: the pass is optional. An API error leaves that note's rewrite empty and is reported.
    """
    if client is None and not os.environ.get("ANTHROPIC_API_KEY"):
        return list(notes), []
    import anthropic

    client = client or anthropic.Anthropic()
    out, problems = [], []
    for n in notes:
        prompt = _PROMPT.format(check=n.check, cause=n.cause, diagnosis=n.diagnosis,
                                silent="exited 0 and printed no error" if n.silent else "failed visibly")
        try:
            msg = client.messages.create(model=model, max_tokens=LLM_MAX_TOKENS,
                                         messages=[{"role": "user", "content": prompt}])
            text = "".join(getattr(b, "text", "") for b in msg.content).strip()
        except anthropic.APIError as e:
            problems.append(f"{n.check}: rewrite failed ({type(e).__name__}: {e})")
            out.append(n)
            continue
        out.append(n.model_copy(update={"diagnosis_llm": text or None}))
    return out, problems


def record_checked_run(journal: "Journal", attempt: int, run_dir: Path, result: LadderResult, *,
                       root: Path | None = None, client: Any | None = None) -> tuple[list["Entry"], list[str]]:
    """Append a checked run to the journal as the supervisor does: the run (sealed by its manifest
    digest), its check, and one failure note per failed check. Returns the entries and the problems
    of the optional rewrite pass (which never stop the notes from being recorded)."""
    from ladder.journal.entries import append_check, append_failure_notes, append_run

    run = RunRecord.load(Path(run_dir))
    notes, problems = rewrite_diagnoses(draft_notes(result, run), client)
    if root is not None:
        notes = [n.model_copy(update={"run_dir": ref_path(Path(n.run_dir), root)}) if n.run_dir else n
                 for n in notes]
    entries = [append_run(journal, attempt, Path(run_dir), root=root),
               append_check(journal, attempt, result, run.kind, root=root)]
    entries += append_failure_notes(journal, attempt, notes)
    return entries, problems
