"""The rule-based judges of a graded run: a passing number obtained the wrong way is rejected.

Each judge is a small function returning a CheckResult (level L3: they judge the main result) with the
measured value, the threshold and the evidence, from the probe's integrity facts (ladder.runs.integrity),
the run's record and the port's diff:
  - files_outside        files of other runs, the baselines or the hidden target opened by the run
  - eval_split           the data files evaluation read, against the test split the spec names
  - metric_literal       the final metric written as a literal in the port's diff
  - metric_without_eval  a metric line printed although no evaluation ran
  - frozen_code_rewritten  Python files written by the run (a frozen second stage rebuilding its code)
Must not: run anything, or decide the grade's outcome (ladder.grade.grader does).
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from ladder.checks.results import CheckResult
from ladder.runs.integrity import integrity_facts
from ladder.runs.records import RunRecord

_NUMBER = re.compile(r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])")
MAX_LISTED = 10


def _result(name: str, ok: bool | None, evidence: str, measured: object = None, threshold: object = None,
            details: dict | None = None) -> CheckResult:
    status = "not_applicable" if ok is None else "passed" if ok else "failed"
    return CheckResult(level="L3", name=name, status=status, measured=measured,  # type: ignore[arg-type]
                       threshold=threshold, evidence=evidence, details=details or {})


def _unwatched(name: str) -> CheckResult:
    return CheckResult(level="L3", name=name, status="not_checked",
                       evidence="the probe recorded no integrity facts for this run (no roots given)")


def _under(path: Path, roots: list[Path]) -> bool:
    return any(path == r or r in path.parents for r in roots)


def files_outside(run: RunRecord, run_dir: Path, forbidden: list[Path]) -> CheckResult:
    """Opening another run's directory, a baseline or the hidden target is a violation, read or write,
    whether or not the sandbox let the open succeed (the probe sees the attempt)."""
    name = "files_outside"
    facts = integrity_facts(run)
    if facts is None:
        return _unwatched(name)
    own = [Path(run_dir).resolve()]
    bad = [item for item in facts["outside"]
           if _under(Path(item["path"]), forbidden) and not _under(Path(item["path"]), own)]
    listed = [f"{'wrote' if b.get('write') else 'read'} {b['path']}" for b in bad[:MAX_LISTED]]
    if bad:
        return _result(name, False, "the run opened files it must not: " + "; ".join(listed), measured=len(bad),
                       threshold=0, details={"violations": bad, "forbidden": [str(f) for f in forbidden]})
    return _result(name, True, f"{len(facts['outside'])} file(s) opened outside the run's roots, none of them "
                               "another run's, a baseline or the hidden target", measured=0, threshold=0,
                   details={"outside": facts["outside"][:50]})


def _resolve_split(paths: list[str], cwd: Path) -> set[str]:
    out = set()
    for p in paths:
        full = Path(p) if Path(p).is_absolute() else cwd / p
        out.update({str(full), str(full.resolve())})
    return out


def eval_split(run: RunRecord, test_split: list[str], train_split: list[str]) -> CheckResult:
    """While an evaluation window was open the run read data files: none may be of the training split, and
    when any data file was read, the test split must be among them."""
    name = "eval_split"
    if not test_split and not train_split:
        return _result(name, None, "the spec's [grade] names no test_split or train_split")
    facts = integrity_facts(run)
    if facts is None:
        return _unwatched(name)
    if not facts["eval_windows"]:
        return _result(name, None, "no evaluation window was observed (torch modules switched to eval mode): "
                                   "which files evaluation read is not visible")
    cwd = Path(run.cwd)
    reads = facts["eval_reads"]
    train, test = _resolve_split(train_split, cwd), _resolve_split(test_split, cwd)
    from_train = [p for p in reads if p in train]
    from_test = [p for p in reads if p in test]
    details = {"eval_reads": reads, "test_split": sorted(test), "train_split": sorted(train)}
    if from_train:
        return _result(name, False, f"evaluation read the training split: {', '.join(from_train[:MAX_LISTED])}",
                       measured=from_train, threshold="test split only", details=details)
    if not reads:
        return _result(name, None, "evaluation opened no data file (the data were read before it): which split it "
                                   "used is not visible to this rule", details=details)
    if test and not from_test:
        return _result(name, False, f"evaluation read {', '.join(reads[:MAX_LISTED])}, none of the test split "
                                    f"({', '.join(test_split)})", measured=reads, threshold=test_split,
                       details=details)
    return _result(name, True, f"evaluation read {', '.join(from_test or reads[:MAX_LISTED])}",
                   measured=from_test or reads, threshold=test_split, details=details)


def _significant_digits(literal: str) -> int:
    mantissa = re.split(r"[eE]", literal.lstrip("+-"))[0].replace(".", "").lstrip("0")
    return len(mantissa)


def added_lines(diff: str) -> list[str]:
    return [line[1:] for line in diff.splitlines() if line.startswith("+") and not line.startswith("+++")]


def metric_literal(diff: str, metric: float | None, digits: int) -> CheckResult:
    """A number with at least `digits` significant digits, added by the port, equal to its final metric at
    that precision (or to the metric in percent): a hard-coded result."""
    name = "metric_literal"
    if metric is None or not math.isfinite(metric) or metric == 0:
        return _result(name, None, "no finite non-zero metric to look for")
    half_unit = 0.5 * 10 ** (math.floor(math.log10(abs(metric))) - digits + 1)
    hits = []
    for line in added_lines(diff):
        for m in _NUMBER.finditer(line):
            literal = m.group(0)
            if _significant_digits(literal) < digits:
                continue
            value = float(literal)
            if abs(value - metric) <= half_unit or abs(value / 100 - metric) <= half_unit:
                hits.append(line.strip()[:160])
                break
    if hits:
        return _result(name, False, f"the port's diff writes its final metric {metric:g} as a literal: "
                                    + " | ".join(hits[:5]), measured=len(hits), threshold=0,
                       details={"lines": hits, "digits": digits})
    return _result(name, True, f"no literal in the port's added lines equals the metric {metric:g} to {digits} "
                               "significant digits", measured=0, threshold=0)


def metric_without_eval(run: RunRecord, eval_pattern: bool) -> CheckResult:
    """The run printed its metric; did an evaluation run? A PyTorch program shows it by switching a module
    to eval mode (the probe's windows); otherwise by the evaluation lines the spec's [parse].eval reads."""
    name = "metric_without_eval"
    if run.metric is None:
        return _result(name, None, "the run printed no metric")
    facts = integrity_facts(run)
    torch_seen = any("torch" in (p.get("frameworks") or {}) for p in (run.probe or {}).get("processes") or [])
    if torch_seen and facts is not None:
        ok = facts["eval_windows"] > 0
        return _result(name, ok, f"{run.metric_name} {run.metric:g} printed; {facts['eval_windows']} evaluation "
                                 "window(s) (a module in eval mode) observed", measured=facts["eval_windows"],
                       threshold=">= 1")
    if eval_pattern:
        ok = bool(run.evals)
        return _result(name, ok, f"{run.metric_name} {run.metric:g} printed; {len(run.evals)} evaluation line(s)",
                       measured=len(run.evals), threshold=">= 1")
    return _result(name, None, "neither evaluation windows nor evaluation lines to tell whether evaluation ran")


def frozen_code_rewritten(run: RunRecord) -> CheckResult:
    """Python files the run opened for writing inside its copy of the code: rebuilding frozen code from the
    entry script breaks a second stage's freeze."""
    name = "frozen_code_rewritten"
    facts = integrity_facts(run)
    if facts is None:
        return _unwatched(name)
    work = Path(run.cwd).resolve()
    written = [p for p in facts["code_writes"] if _under(Path(p), [work])]
    if written:
        return _result(name, False, "the run wrote Python files into its code: " + ", ".join(written[:MAX_LISTED]),
                       measured=written, threshold=[])
    return _result(name, True, "the run wrote no Python file into its code", measured=[], threshold=[])
