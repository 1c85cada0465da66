"""Failure notes drafted from real runs: a crash, a silent L1 divergence, an aten:: CPU fallback and a
recompilation each get a note naming the right cause; the optional LLM rewrite goes through the
Anthropic SDK against a local HTTP server (no network) and is stored beside the rule-based draft."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from helpers import FakeAnthropic, cli_json, workspace
from ladder._cli.check import check_run
from ladder.journal import Journal
from ladder.journal.entries import FailureNote, parse
from ladder.journal.notes import draft_notes, record_checked_run, rewrite_diagnoses
from ladder.runs.records import Provenance, RunRecord
from ladder.checks.results import CheckResult, LadderResult
from test_l2_checks import runs  # noqa: F401  (the memoised captured-run fixture)


def _by_check(notes: list[FailureNote]) -> dict[str, FailureNote]:
    return {n.check: n for n in notes}


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    ws = workspace(tmp_path_factory.mktemp("notes"))
    cli_json("baseline", "--short-only", cwd=ws)
    return ws


def _port(ws: Path, tmp: Path, old: str, new: str) -> Path:
    src = tmp / "port"
    src.mkdir()
    text = (ws / "train.py").read_text()
    assert old in text
    (src / "train.py").write_text(text.replace(old, new, 1))
    return src


def _checked(ws: Path, src: Path) -> tuple[LadderResult, RunRecord, Path]:
    run_dir = Path(cli_json("run", "--on", "target", "--source", str(src), cwd=ws)["run_dir"])
    return check_run(run_dir, ws / "ladder.toml", None), RunRecord.load(run_dir), run_dir


@pytest.mark.slow
def test_crash_note_names_the_error_line_and_is_not_silent(tiny: Path, tmp_path: Path) -> None:
    result, run, _ = _checked(tiny, _port(tiny, tmp_path, "default=-1)", "default=60)"))
    notes = _by_check(draft_notes(result, run))
    crash = notes["L0/finished"]
    assert crash.cause == "L0/finished failed: measured 1 vs threshold 0"
    assert crash.diagnosis == ("the process crashed with exit code 1: "
                               "RuntimeError: simulated crash in the training step")
    assert crash.silent is False and crash.fix == "" and crash.level == "L0"
    assert "L0/metric_reported" in notes  # every failed check gets its own note
    assert notes["L0/metric_reported"].diagnosis.startswith("the run did not finish (see L0/finished)")
    assert all(n.check.split("/")[1] in {c.name for c in result.checks if c.status == "failed"}
               for n in notes.values())


def test_a_native_abort_is_named_by_its_fatal_line() -> None:
    # The last lines of a real abort (recorded from a held-out benchmark run): absl's fatal line, then a native
    # stack trace and no Python exception. The note quoted the trace's last address; it names the fatal line
    # and what a collective timeout means.
    rec = json.loads((Path(__file__).parent / "fixtures" / "crashes" / "xla_rendezvous_abort.json").read_text())
    run = RunRecord(run_id="r", kind="full", profile="target", platform="jax-cpu", seed=1, command="python train.py",
                    cwd=".", started_at=0.0, ended_at=63.4, exit_code=rec["exit_code"], killed=rec["killed"],
                    timeout_s=3600, provenance=Provenance(source="recorded"), last_lines=rec["last_lines"],
                    error_lines=rec["error_lines"])
    finished = CheckResult(level="L0", name="finished", status="failed", measured=run.exit_code, threshold=0,
                           evidence="exit code 134")
    result = LadderResult(run_dir=".", achieved_level=None, checks=[finished])
    note = _by_check(draft_notes(result, run))["L0/finished"]
    assert note.diagnosis.startswith("the process aborted in native code (exit code 134): F1202"), note.diagnosis
    assert "Termination timeout for `all reduce" in note.diagnosis and "threads starved" in note.diagnosis
    assert "0x7f" not in note.diagnosis  # not the stack trace's last line


def test_a_collective_timeout_of_fake_cpu_devices_is_the_machines_failure_not_the_ports() -> None:
    # The same recorded abort: 4 fake CPU devices (threads of one process) whose all-reduce timed out while the
    # machine ran another run on its 2 cores. On the host that is the infrastructure's failure: L0 says
    # not_checked and the supervisor (and the detection benchmark) start the run again. On accelerators the
    # same line means a rank died or took another branch: the port's.
    from ladder.checks import CheckContext, run_ladder
    from ladder.migration.protocol import load_protocol
    from ladder.migration.spec import Profile
    from ladder.runs.execute import starved_collectives

    rec = json.loads((Path(__file__).parent / "fixtures" / "crashes" / "xla_rendezvous_abort.json").read_text())

    def run(exit_code: int, lines: list[str]) -> RunRecord:
        return RunRecord(run_id="r", kind="full", profile="target", platform="jax-cpu", seed=1,
                         command="python train.py", cwd=".", started_at=0.0, ended_at=63.4, exit_code=exit_code,
                         timeout_s=3600, provenance=Provenance(source="recorded"), last_lines=lines)

    aborted = run(rec["exit_code"], rec["last_lines"])
    infra = starved_collectives(aborted, Profile(platform="jax-cpu", price_per_hour=0), {})
    assert infra is not None and infra.kind == "collectives_starved" and "Termination timeout for `all reduce" in infra.detail
    xla_cpu = starved_collectives(aborted, Profile(platform="xla", price_per_hour=0), {"PJRT_DEVICE": "CPU"})
    assert xla_cpu is not None
    for platform in ("jax-tpu", "jax-gpu", "tpu", "cuda"):  # real devices: the port's failure
        assert starved_collectives(aborted, Profile(platform=platform, price_per_hour=0), {"PJRT_DEVICE": "TPU"}) is None, platform
    # another native abort on the host stays the port's
    other = run(134, ["F1202 08:44:30.230733 9 pjrt_client.cc:11] Check failed: shape mismatch"])
    assert starved_collectives(other, Profile(platform="jax-cpu", price_per_hour=0), {}) is None
    aborted.infrastructure = infra
    finished = next(c for c in run_ladder(CheckContext(run=aborted, protocol=load_protocol()), up_to="L0").checks
                    if c.name == "finished")
    assert finished.status == "not_checked" and "collectives_starved" in finished.evidence, finished.evidence


@pytest.mark.slow
def test_silent_l1_divergence_says_which_way_and_how_far(tiny: Path, tmp_path: Path) -> None:
    result, run, run_dir = _checked(tiny, _port(tiny, tmp_path, "default=0.0)", "default=0.05)"))
    assert run.exit_code == 0 and not run.error_lines
    notes = _by_check(draft_notes(result, run))
    lw = notes["L1/loss_window"]
    fixed = next(c for c in result.checks if c.name == "loss_window").details["fixed_rule"]
    rel = (fixed["run"] - fixed["baseline"]) / fixed["baseline"]
    assert rel > 0.05
    assert lw.silent is True
    assert f"{rel:.1%} higher than the baseline's" in lw.diagnosis
    band = next(c for c in result.checks if c.name == "loss_window").threshold
    assert lw.cause.startswith("L1/loss_window failed: measured ") and " vs band " in lw.cause
    assert f"({band['seeds']} seeds)" in lw.cause and str(round(band["hi"], 2))[:4] in lw.cause
    assert not [n for n in notes.values() if n.level == "L0"]

    # The supervisor's path: run, check and notes go into the journal, sealed by the run's digest.
    with Journal(tmp_path / "j.sqlite") as j:
        entries, problems = record_checked_run(j, 1, run_dir, result, root=tiny)
        assert problems == []
        kinds = [e.kind for e in entries]
        assert kinds[:2] == ["run", "check"] and kinds[2:] == ["failure_note"] * len(notes)
        stored = parse(entries[2])
        assert isinstance(stored, FailureNote) and stored.run_dir == f"runs/tiny/{run_dir.name}"
        assert entries[0].content["refs"][0]["path"] == f"runs/tiny/{run_dir.name}"


def _xla_notes(runs, torch_python: str, xla_python: str, fault: str) -> dict[str, FailureNote]:
    # The same captured runs as tests/test_l2_checks.py (memoised there): one XLA run per fault per session.
    from test_l2_checks import l2

    ref = runs(torch_python, "torch_train.py")
    run = runs(xla_python, "torch_train.py", "--device", "xla", "--fault", fault)
    result = LadderResult(run_dir=run.cwd, achieved_level=None, checks=list(l2(run, "xla", ref).values()))
    return _by_check(draft_notes(result, run))


@pytest.mark.slow
@pytest.mark.xla
def test_aten_fallback_note_names_the_op_and_its_count(runs, torch_python: str, xla_python: str) -> None:
    notes = _xla_notes(runs, torch_python, xla_python, "unique")
    fb = notes["L2/cpu_fallback"]
    assert fb.diagnosis.startswith("`aten::_unique2` ran 40 times: the op is not lowered to XLA and "
                                   "runs on the CPU"), fb.diagnosis
    assert fb.silent is True and fb.cause.startswith('L2/cpu_fallback failed: measured {"aten::_unique2": 40}')


@pytest.mark.slow
@pytest.mark.xla
def test_recompilation_note_says_shapes_change_per_step(runs, torch_python: str, xla_python: str) -> None:
    notes = _xla_notes(runs, torch_python, xla_python, "shape")
    rc = notes["L2/recompilation"]
    from test_l2_checks import l2

    check = l2(runs(xla_python, "torch_train.py", "--device", "xla", "--fault", "shape"), "xla",
               runs(torch_python, "torch_train.py"))["recompilation"]
    late = sorted({s for p in check.details["processes"] for s in p["second_half_steps"]})
    assert len(late) >= 3 and f"new graphs at steps {', '.join(map(str, late[:3]))}" in rc.diagnosis, rc.diagnosis
    assert "the reference: 0 such steps" in rc.diagnosis
    assert "shapes change per step" in rc.diagnosis and rc.silent is True


def test_unknown_check_and_reshaped_details_fall_back_to_the_evidence() -> None:
    from ladder.runs.records import Provenance

    run = RunRecord(run_id="r", kind="short", profile="t", platform="cpu", seed=0, command="x", cwd="/",
                    started_at=0.0, ended_at=1.0, exit_code=0, timeout_s=10, provenance=Provenance(source="t"))
    checks = [CheckResult(level="L3", name="main_result", status="failed", measured=0.8, threshold=0.85,
                          evidence="full-run acc 0.80 below the band 0.85-0.87"),
              CheckResult(level="L2", name="cpu_fallback", status="failed", measured="weird",
                          details={"fallback": "not a dict"}, evidence="counters unreadable"),
              CheckResult(level="L1", name="metric", status="passed"),
              CheckResult(level="L1", name="trend", status="undecided")]
    notes = draft_notes(LadderResult(run_dir="r", achieved_level=None, checks=checks), run)
    assert [n.check for n in notes] == ["L3/main_result", "L2/cpu_fallback"]
    assert notes[0].diagnosis == "full-run acc 0.80 below the band 0.85-0.87"
    assert notes[0].cause == "L3/main_result failed: measured 0.8 vs threshold 0.85"
    assert notes[1].diagnosis == "counters unreadable"


# ---------------------------------------------------------------- the optional LLM rewrite, offline

@pytest.fixture
def fake_api():
    def answer(prompt: str) -> str:
        return f"Plain words about {prompt.split('Check: ')[1].splitlines()[0]}."

    with FakeAnthropic(answer) as api:
        yield api.url, api


def _two_notes() -> list[FailureNote]:
    return [FailureNote(check="L2/recompilation", level="L2", cause="c1", diagnosis="d1", silent=True, run_dir="r"),
            FailureNote(check="L0/finished", level="L0", cause="c2", diagnosis="d2", silent=False, run_dir="r")]


def test_llm_rewrite_is_stored_beside_the_rule_based_draft(fake_api, monkeypatch) -> None:
    import anthropic

    url, handler = fake_api
    client = anthropic.Anthropic(api_key="test-key", base_url=url, max_retries=0)
    out, problems = rewrite_diagnoses(_two_notes(), client)
    assert problems == []
    assert [n.diagnosis for n in out] == ["d1", "d2"]  # the rule-based draft stays
    assert [n.diagnosis_llm for n in out] == ["Plain words about L2/recompilation.", "Plain words about L0/finished."]
    assert [s["path"] for s in handler.seen] == ["/v1/messages"] * 2 and handler.seen[0]["key"] == "test-key"
    assert "exited 0 and printed no error" in handler.seen[0]["body"]["messages"][0]["content"]

    # Through the environment, as a user sets it up: ANTHROPIC_API_KEY and the SDK's base URL variable.
    monkeypatch.setenv("ANTHROPIC_API_KEY", "env-key")
    monkeypatch.setenv("ANTHROPIC_BASE_URL", url)
    out, _ = rewrite_diagnoses(_two_notes()[:1])
    assert out[0].diagnosis_llm == "Plain words about L2/recompilation." and handler.seen[-1]["key"] == "env-key"


def test_llm_errors_and_a_missing_key_never_fail_the_notes(fake_api, monkeypatch) -> None:
    import anthropic

    url, handler = fake_api
    handler.fail = True
    out, problems = rewrite_diagnoses(_two_notes(), anthropic.Anthropic(api_key="k", base_url=url, max_retries=0))
    assert [n.diagnosis_llm for n in out] == [None, None] and [n.diagnosis for n in out] == ["d1", "d2"]
    assert len(problems) == 2 and "rewrite failed" in problems[0]

    monkeypatch.delenv("ANTHROPIC_API_KEY", raising=False)
    before = len(handler.seen)
    out, problems = rewrite_diagnoses(_two_notes())
    assert out == _two_notes() and problems == [] and len(handler.seen) == before


def test_platform_note_blames_cpu_placement_not_a_pjrt_cpu_device() -> None:
    from ladder.runs.records import Provenance

    run = RunRecord(run_id="r", kind="short", profile="t", platform="xla", seed=0, command="x", cwd="/",
                    started_at=0.0, ended_at=1.0, exit_code=0, timeout_s=10, provenance=Provenance(source="t"))
    on_cpu = CheckResult(level="L2", name="platform", status="failed", threshold="xla",
                         measured={"torch": ["cpu"], "xla": ["CPU"], "jax": []},
                         evidence="expected xla: tensors on cpu (first: Sequential forwards at +0.1s)"
                                  " — a silent CPU fallback")
    on_pjrt_cpu = CheckResult(level="L2", name="platform", status="failed", threshold="tpu",
                              measured={"torch": ["xla"], "xla": ["CPU"], "jax": []},
                              evidence="xla tensors, but the PJRT device was ['CPU'], not TPU")
    notes = draft_notes(LadderResult(run_dir="r", achieved_level=None, checks=[on_cpu, on_pjrt_cpu]), run)
    assert notes[0].diagnosis.startswith("the computation ran on the CPU instead of xla")
    assert notes[1].diagnosis.startswith("the computation did not run where expected (tpu)")
