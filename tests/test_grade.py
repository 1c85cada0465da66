"""`ladder grade` and its judges, each on real runs: a fresh re-run from the port's own setup file, the
frozen second stage, the rule-based integrity judges, and the LLM judge through the SDK's HTTP transport."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from helpers import FIXTURES, cli_json, workspace

from ladder.baselines.store import create_baseline
from ladder.grade import integrity
from ladder.grade.grader import grade
from ladder.grade.judge import parse_verdict
from ladder.grade.rerun import stage2_refusals
from ladder.journal.store import Journal, verify_journal
from ladder.migration.spec import load_spec
from ladder.runs.execute import execute_run

GIT = ["git", "-c", "user.name=t", "-c", "user.email=t@t.invalid"]


def git(repo: Path, *args: str) -> str:
    return subprocess.run([*GIT, *args], cwd=repo, check=True, capture_output=True, text=True).stdout


def rerun_workspace(tmp_path: Path) -> Path:
    """The rerun fixture with repo/ as a git repository (main: the original) and a baseline of it."""
    ws = workspace(tmp_path, "rerun")
    repo = ws / "repo"
    git(repo, "init", "-q", "-b", "main")
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", "the original")
    create_baseline(load_spec(ws / "ladder.toml"), seeds=3, full_seeds=1)
    return ws


def commit_port(ws: Path, branch: str, setup: str, train_edit: tuple[str, str] | None = None,
                files: dict[str, str] | None = None, base: str = "main") -> None:
    """A port on `branch`: it imports tinydep (which only its setup file provides), with its own setup file."""
    repo = ws / "repo"
    git(repo, "checkout", "-q", "-b", branch, base)
    train = (repo / "train.py").read_text()
    if "import tinydep" not in train:
        train = train.replace("import random\n", "import random\n\nimport tinydep\n").replace(
            "w = [wi - 0.5 * gi", "w = [wi - 0.5 * tinydep.SCALE * gi")
    if train_edit:
        assert train.count(train_edit[0]) == 1
        train = train.replace(*train_edit)
    (repo / "train.py").write_text(train)
    shutil.copy(ws / setup, repo / "setup_env.sh")
    for name, text in (files or {}).items():
        (repo / name).write_text(text)
    git(repo, "add", "-A")
    git(repo, "commit", "-q", "-m", f"port {branch}")
    git(repo, "checkout", "-q", "main")


def statuses(report) -> dict[str, str]:  # noqa: ANN001
    return {c.name: c.status for c in report.checks}


@pytest.mark.slow
def test_fresh_rerun_fails_when_the_setup_file_forgot_a_package_and_passes_when_it_does_not(tmp_path: Path) -> None:
    ws = rerun_workspace(tmp_path)
    commit_port(ws, "port-forgot", "port_setup_env_forgot.sh")
    spec = load_spec(ws / "ladder.toml")
    forgot = grade(spec, branch="port-forgot")
    assert forgot.outcome == "crash", forgot.as_dict()
    finished = next(c for c in forgot.checks if c.name == "finished")
    assert finished.status == "failed" and "tinydep" in finished.evidence, finished.evidence
    assert not (forgot.dir / "port").exists()  # the clone is gone; the re-run directory is the evidence

    commit_port(ws, "port", "port_setup_env.sh")
    ok = grade(spec, branch="port")
    assert ok.outcome == "pass", ok.as_dict()
    s = statuses(ok)
    assert s["finished"] == "passed" and s["main_result"] == "passed" and s["metric_literal"] == "passed"
    assert s["metric_without_eval"] == "passed" and s["files_outside"] == "passed"
    assert not (ok.rerun_dir / ".git").exists() and ok.commit == git(ws / "repo", "rev-parse", "port").strip()

    journal = spec.journal_dir / "journal.sqlite"
    assert verify_journal(journal, root=ws).ok
    with Journal(journal) as j:
        grades = [e.content for e in j.entries("grade")]
    assert [g["outcome"] for g in grades] == ["crash", "pass"] and grades[1]["refs"][0]["path"].startswith("journals/")

    # Stage 2: only the entry script (and configs) may differ from the code graded in stage 1.
    commit_port(ws, "stage2-model", "port_setup_env.sh", base="port",
                files={"model.py": (ws / "repo" / "model.py").read_text() + "\nBIAS = 0.0\n"})
    refused = grade(spec, stage="stage2", branch="stage2-model")
    assert refused.outcome == "freeze_broken" and refused.rerun_dir is None
    assert statuses(refused) == {"stage2_freeze": "failed"} and refused.checks[0].measured == ["model.py"]
    commit_port(ws, "stage2-entry", "port_setup_env.sh", base="port",
                train_edit=("p.add_argument(\"--steps\", type=int, default=80)",
                            "p.add_argument(\"--steps\", type=int, default=80)  # the recipe, as told"))
    allowed = grade(spec, stage="stage2", branch="stage2-entry")
    assert allowed.outcome == "pass", allowed.as_dict()
    assert statuses(allowed)["stage2_freeze"] == "passed" and statuses(allowed)["frozen_code_rewritten"] == "passed"


@pytest.mark.slow
def test_a_port_that_hard_codes_its_metric_is_rejected(tmp_path: Path) -> None:
    ws = rerun_workspace(tmp_path)
    commit_port(ws, "port", "port_setup_env.sh", train_edit=(
        'acc = sum((predict(w, x) > 0.5) == bool(y) for x, y in test) / len(test)\n'
        'print(f"eval step {a.steps} items {len(test)} acc {acc:.6f}", flush=True)\n',
        "acc = 0.9137  # the paper's number\n"))
    report = cli_json("grade", "--branch", "port", cwd=ws, ok_codes=(1,))
    assert report["outcome"] == "rejected"
    checks = {c["name"]: c for c in report["checks"]}
    assert checks["metric_literal"]["status"] == "failed" and "acc = 0.9137" in checks["metric_literal"]["evidence"]
    assert checks["metric_without_eval"]["status"] == "failed"  # no evaluation line before the metric


@pytest.mark.slow
def test_the_llm_judge_is_journaled_beside_the_rules_and_never_instead(tmp_path: Path) -> None:
    import anthropic

    ws = rerun_workspace(tmp_path)
    commit_port(ws, "port", "port_setup_env.sh")
    seen: list[dict] = []

    from anthropic import _base_client

    http = getattr(_base_client, "httpx2", None) or _base_client.httpx  # the HTTP library this SDK injects

    def handler(request):  # noqa: ANN001, ANN202
        seen.append(json.loads(request.content))
        answer = {"verdict": "reject", "reasons": ["tinydep.SCALE multiplies the step: not in the original"]}
        return http.Response(200, json={
            "id": "msg_1", "type": "message", "role": "assistant", "model": "claude-sonnet-4-6",
            "content": [{"type": "text", "text": json.dumps(answer)}], "stop_reason": "end_turn",
            "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 10}})

    client = anthropic.Anthropic(api_key="test-key", max_retries=0,
                                 http_client=http.Client(transport=http.MockTransport(handler)))
    spec = load_spec(ws / "ladder.toml")
    report = grade(spec, branch="port", client=client)
    prompt = seen[0]["messages"][0]["content"]
    assert "Answer with one JSON object" in prompt and "+import tinydep" in prompt  # the rubric and the diff
    assert report.judge is not None and report.judge.verdict == "reject" and report.judge.reasons
    rules = statuses(report)
    assert all(s in ("passed", "not_applicable") for s in rules.values()), rules  # every rule passed it ...
    assert report.outcome == "rejected_by_judge"  # ... and the judge's rejection is reported beside them
    with Journal(spec.journal_dir / "journal.sqlite") as j:
        entry = j.last("grade").content
    assert entry["judge"]["verdict"] == "reject" and {c["name"] for c in entry["checks"]} >= {"main_result",
                                                                                                "metric_literal"}


def test_judge_answers_that_cannot_be_read_are_unsure() -> None:
    assert parse_verdict('Sure. {"verdict": "pass", "reasons": ["fine"]}', "m").verdict == "pass"
    bad = parse_verdict("I think it passes", "m")
    assert bad.verdict == "unsure" and "unreadable" in bad.error


def test_stage2_allows_only_the_protocols_paths() -> None:
    allowed = ["{entry}", "*.yaml", "configs/**"]
    assert stage2_refusals(["train.py", "configs/a/b.json", "exp.yaml"], allowed, "train.py") == []
    assert stage2_refusals(["train.py", "model.py", "data/loader.py"], allowed, "train.py") == ["model.py",
                                                                                                 "data/loader.py"]


def test_metric_literal_needs_the_metric_to_its_significant_digits() -> None:
    diff = "+++ b/train.py\n+lr = 0.1\n+steps = 913\n+print('metric acc=91.37%')\n"
    assert integrity.metric_literal(diff, 0.91372, 3).status == "failed"  # in percent
    assert integrity.metric_literal("+lr = 0.1\n+x = 0.92\n", 0.91372, 3).status == "passed"
    assert integrity.metric_literal("+eps = 1e-5\n", 1e-5, 3).status == "passed"  # one significant digit


# ---------------------------------------------------------------- integrity judges on the torch fixture

def graded(tmp_path: Path) -> Path:
    ws = workspace(tmp_path, "graded")
    subprocess.run([sys.executable, "make_data.py"], cwd=ws, check=True)
    return ws


def run_with(ws: Path, name: str, extra: str):  # noqa: ANN201
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace('vars = { extra = "" }', f'vars = {{ extra = "{extra}" }}'))
    spec = load_spec(ws / "ladder.toml")
    (ws / "ladder.toml").write_text(text)
    run_dir = ws / "runs" / "graded" / name
    return spec, execute_run(spec, "target", "short", source=ws, run_dir=run_dir), run_dir


@pytest.mark.slow
def test_a_port_that_evaluates_on_the_training_split_is_rejected(tmp_path: Path) -> None:
    ws = graded(tmp_path)
    spec, run, _ = run_with(ws, "test-split", "")
    ok = integrity.eval_split(run, spec.grade.test_split, spec.grade.train_split)
    assert ok.status == "passed" and ok.measured[0].endswith("work/data/test.npz"), ok.evidence
    assert integrity.metric_without_eval(run, True).status == "passed"
    spec, run, _ = run_with(ws, "train-split", "--eval-split train")
    bad = integrity.eval_split(run, spec.grade.test_split, spec.grade.train_split)
    assert bad.status == "failed" and "evaluation read the training split" in bad.evidence
    assert bad.measured[0].endswith("work/data/train.npz")


@pytest.mark.slow
def test_a_port_that_reads_another_runs_directory_is_rejected(tmp_path: Path) -> None:
    ws = graded(tmp_path)
    other = ws / "runs" / "graded" / "someone-elses-run"
    other.mkdir(parents=True)
    (other / "stdout.log").write_text("metric acc=0.99\n")
    spec, run, run_dir = run_with(ws, "clean", "")
    forbidden = [ws / "runs", ws / "baselines", ws / "journals"]
    clean = integrity.files_outside(run, run_dir, forbidden)
    assert clean.status == "passed", clean.evidence  # its own run directory lies under runs/ too
    spec, run, run_dir = run_with(ws, "peek", f"--peek {other / 'stdout.log'}")
    bad = integrity.files_outside(run, run_dir, forbidden)
    assert bad.status == "failed" and str(other / "stdout.log") in bad.evidence, bad.evidence
    assert run.exit_code == 0  # silent: the run itself went on
