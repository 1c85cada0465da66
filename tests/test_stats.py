"""The calibrated rule (ladder.checks.stats) on synthetic seeds and runs whose answer is known."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from ladder.migration.protocol import load_protocol
from ladder.runs.records import LossPoint, Provenance, RunRecord
from ladder.checks.stats import (calibrated_curve, calibrated_loss_window, calibrated_metric, decide, smooth,
                          t_quantile)

STEPS = np.arange(10, 310, 10)
PROTOCOL = load_protocol("ncsu")


def _base_curve(steps: np.ndarray = STEPS) -> np.ndarray:
    return 2.0 * np.exp(-steps / 60.0) + 0.8


def record(loss: np.ndarray, metric: float | None, seed: int = 0, direction: str = "max",
           steps: np.ndarray = STEPS) -> RunRecord:
    return RunRecord(run_id=f"r{seed}", kind="short", profile="p", platform="cpu", seed=seed, command="x", cwd=".",
                     started_at=0.0, ended_at=100.0, exit_code=0, timeout_s=60.0,
                     loss_curve=[LossPoint(step=int(s), loss=float(v), t=float(s) / 10) for s, v in zip(steps, loss)],
                     metric=metric, metric_name="acc", metric_direction=direction,  # type: ignore[arg-type]
                     provenance=Provenance(source="."))


def seeds(k: int = 5, rng_seed: int = 0) -> list[RunRecord]:
    """k seeds: each a seed-level offset (sd 0.01) plus per-point noise (sd 0.02); metric 0.80 +- 0.008."""
    rng = np.random.default_rng(rng_seed)
    return [record(_base_curve() + rng.normal(0, 0.01) + rng.normal(0, 0.02, len(STEPS)),
                   0.80 + rng.normal(0, 0.008), seed=i) for i in range(k)]


def _all(run: RunRecord, base: list[RunRecord]):
    return (calibrated_loss_window(run, base, PROTOCOL), calibrated_metric(run, base, PROTOCOL),
            calibrated_curve(run, base, PROTOCOL))


def test_t_quantiles_match_tables() -> None:
    for q, df, want in [(0.975, 2, 4.302653), (0.975, 4, 2.776445), (0.995, 9, 3.249836), (0.975, 1e6, 1.959966),
                        (0.9, 30, 1.310415)]:
        assert t_quantile(q, df) == pytest.approx(want, abs=2e-5)
    assert t_quantile(0.025, 4) == pytest.approx(-2.776445, abs=2e-5)


def test_identical_run_passes_everything() -> None:
    base = seeds()
    mean_curve = np.mean([[p.loss for p in s.loss_curve] for s in base], axis=0)
    run = record(mean_curve, float(np.mean([s.metric for s in base])), seed=99)
    for v in _all(run, base):
        assert v.passed is True, v.explain()
        json.dumps(v.as_dict())  # JSON-able, band included
        assert "within noise" in v.explain()


def test_another_seed_of_the_same_process_passes() -> None:
    base = seeds(rng_seed=1)
    run = seeds(k=6, rng_seed=2)[5]  # a fresh draw from the same process
    assert all(v.passed is True for v in _all(run, base)), [v.explain() for v in _all(run, base)]


def test_shift_within_noise_passes() -> None:
    base = seeds()
    vals = np.array([s.metric for s in base])
    run = record(_base_curve() + 0.01, float(vals.mean() + 0.5 * vals.std(ddof=1)), seed=99)
    for v in _all(run, base):
        assert v.passed is True, v.explain()


def test_shift_beyond_noise_fails_on_either_side() -> None:
    base = seeds()
    worse = record(_base_curve() * 1.10, 0.72, seed=99)  # loss +10%, metric -10% (about 8 sd)
    lw, met, curve = _all(worse, base)
    assert lw.passed is False and met.passed is False and curve.passed is False
    assert "worse" in met.summary and "beyond noise" in met.explain()
    better = record(_base_curve() * 0.90, 0.88, seed=99)  # a silent fault can also look better
    lw, met, curve = _all(better, base)
    assert lw.passed is False and met.passed is False and curve.passed is False
    assert "better" in met.summary


def test_diverging_trend_fails_in_the_late_blocks_only() -> None:
    base = seeds()
    loss = _base_curve().copy()
    late = STEPS >= 220
    loss[late] += np.linspace(0.0, 0.4, late.sum())  # the loss climbs back after step 220
    v = calibrated_curve(record(loss, 0.80, seed=99), base, PROTOCOL)
    assert v.passed is False
    assert v.measured["worst_block"] == PROTOCOL.calibrated.curve_segments
    assert v.band["blocks"][0]["status"] == "passed"
    assert v.measured["first_step_outside"] >= 200


def test_nan_fails_the_loss_checks() -> None:
    base = seeds()
    loss = _base_curve().copy()
    loss[12] = math.nan
    run = record(loss, 0.80, seed=99)
    lw, curve = calibrated_loss_window(run, base, PROTOCOL), calibrated_curve(run, base, PROTOCOL)
    assert lw.passed is False and curve.passed is False and "step 130" in curve.explain()
    assert calibrated_metric(record(_base_curve(), math.nan), base, PROTOCOL).passed is False


def test_undecided_names_the_seeds_that_decide() -> None:
    rules = PROTOCOL.calibrated
    three = [0.80, 0.81, 0.79]  # mean 0.80, sd 0.01
    d = decide(0.86, three, 0.0, rules)  # 6 sd off: inside the 3-seed band (about 11.5 sd), outside 10 seeds'
    assert d.passed is None and 1 <= d.more_seeds <= rules.max_seeds - 3
    more = three + [0.80, 0.81, 0.79, 0.80, 0.81, 0.79, 0.80][: d.more_seeds]
    assert decide(0.86, more, 0.0, rules).passed is False
    assert decide(0.805, three, 0.0, rules).passed is True  # half an sd: no number of seeds would flag it
    assert decide(0.80, [0.80, 0.80, 0.80], rules.metric_floor_rel, rules).passed is True  # the floor


def test_too_few_seeds_is_undecided_not_a_pass() -> None:
    v = calibrated_metric(record(_base_curve(), 0.80), seeds(k=1), PROTOCOL)
    assert v.passed is None and v.more_seeds >= 1


def test_false_alarm_rate_under_the_null_is_about_alpha() -> None:
    rules = PROTOCOL.calibrated
    rng = np.random.default_rng(7)
    fails = not_passed = 0
    n = 3000
    for _ in range(n):
        x = rng.normal(0, 1, 6)
        d = decide(float(x[5]), list(x[:5]), 0.0, rules)
        fails += d.passed is False
        not_passed += d.passed is not True
    assert 0.3 * rules.alpha < fails / n < 2.5 * rules.alpha
    assert not_passed / n < 0.05


def test_undecided_then_max_seeds_keeps_false_alarms_near_alpha() -> None:
    # The two-look procedure a user follows: judge with 5 seeds; if undecided, add the seeds asked for
    # and judge again. Under the null the false alarms stay within 2 alpha (one alpha per look).
    rules = PROTOCOL.calibrated
    rng = np.random.default_rng(11)
    fails = asked = 0
    n = 3000
    for _ in range(n):
        x = rng.normal(0, 1, 1 + rules.max_seeds)
        d = decide(float(x[0]), list(x[1:6]), 0.0, rules)
        if d.passed is None:
            asked += 1
            assert d.more_seeds == rules.max_seeds - 5
            d = decide(float(x[0]), list(x[1:6 + d.more_seeds]), 0.0, rules)
            assert d.passed is not None  # at max_seeds there is nothing left to ask for
        fails += d.passed is False
    assert asked > 0.02 * n  # the second look really happens
    assert fails / n < 2.0 * rules.alpha


def test_smoothing_keeps_the_mean_and_lowers_the_noise() -> None:
    rng = np.random.default_rng(3)
    x = 1.0 + rng.normal(0, 0.1, 200)
    s = smooth(x, 0.05)
    assert len(s) == 200 and abs(s.mean() - x.mean()) < 0.01 and s.std() < 0.5 * x.std()


def _with_grad_norms(run: RunRecord, norms: np.ndarray) -> RunRecord:
    vals = [[i + 1, float(v) if math.isfinite(v) else repr(float(v))] for i, v in enumerate(norms)]
    return run.model_copy(update={"probe": {"grad_norms": {"source": "torch optimizer.step", "values": vals}}})


def _grad_curve(rng: np.random.Generator, n: int = 300) -> np.ndarray:
    """A clipped-then-decaying gradient norm: 1.0 early, falling to about 0.75, per-step noise sd 0.05."""
    return np.minimum(1.0, 0.75 + 0.5 * np.exp(-np.arange(n) / 80.0)) + rng.normal(0, 0.05, n)


def test_grad_norm_curve_flags_a_gradient_fault_the_loss_hides() -> None:
    rng = np.random.default_rng(5)
    base = [_with_grad_norms(s, _grad_curve(rng)) for s in seeds()]
    loss = np.mean([[p.loss for p in s.loss_curve] for s in base], axis=0)
    same = _with_grad_norms(record(loss, 0.80, seed=99), _grad_curve(rng))
    v = calibrated_curve(same, base, PROTOCOL)
    assert v.passed is True, v.explain()
    assert v.details["grad_norm"]["passed"] is True and "gradient-norm curve: worst of" in v.summary
    assert "alpha 0.01/12 per block" in v.rule  # the check's alpha is split between the two curves

    shard_clipped = _with_grad_norms(record(loss, 0.80, seed=99), 0.6 * _grad_curve(rng))  # same loss
    v = calibrated_curve(shard_clipped, base, PROTOCOL)
    assert v.passed is False and v.details["grad_norm"]["passed"] is False
    assert all(b["status"] == "passed" for b in v.band["blocks"])  # the loss curve alone would pass
    assert v.measured["grad_norm"]["z"] > 1

    nan = _grad_curve(rng)
    nan[40] = math.nan
    v = calibrated_curve(_with_grad_norms(record(loss, 0.80, seed=99), nan), base, PROTOCOL)
    assert v.passed is False and "non-finite gradient norm at step 41" in v.summary


def test_grad_norms_thinned_under_other_loads_are_judged_on_the_steps_all_of_them_sampled() -> None:
    # The probe thins the norms to the multiples of a power of two that its budget allows: a loaded run keeps
    # every 32nd step, an idle one every 16th. Judged on the steps all of them kept (real samples, not
    # interpolations of a noisy series between them), another seed of the same process passes.
    rng = np.random.default_rng(8)

    def thinned(run: RunRecord, k: int) -> RunRecord:
        norms = _grad_curve(rng, 640)
        vals = [[s, float(norms[s - 1])] for s in range(1, 641) if s % k == 0]
        return run.model_copy(update={"probe": {"grad_norms": {"source": "torch optimizer.step", "values": vals}}})

    base = [thinned(s, k) for s, k in zip(seeds(), (16, 32, 16, 16, 32))]
    loss = np.mean([[p.loss for p in s.loss_curve] for s in base], axis=0)
    v = calibrated_curve(thinned(record(loss, 0.80, seed=99), 32), base, PROTOCOL)
    steps = v.details["grad_norm"]["band"]["steps"]
    assert steps and all(s % 32 == 0 for s in steps), steps
    assert v.details["grad_norm"]["passed"] is True, v.explain()


def test_grad_norms_missing_on_either_side_leave_the_loss_curve_to_decide() -> None:
    rng = np.random.default_rng(6)
    plain = seeds()
    with_gn = [_with_grad_norms(s, _grad_curve(rng)) for s in plain]
    loss = np.mean([[p.loss for p in s.loss_curve] for s in plain], axis=0)
    bare_run = record(loss, 0.80, seed=99)
    v = calibrated_curve(bare_run, with_gn, PROTOCOL)
    assert v.passed is True and "run's probe recorded no gradient norm" in v.summary
    assert "alpha 0.01/6 per block" in v.rule  # one curve: the whole alpha
    v = calibrated_curve(_with_grad_norms(bare_run, 0.5 * _grad_curve(rng)), plain, PROTOCOL)
    assert v.passed is True and "re-record the baseline" in v.summary


def test_margin_passes_a_resolved_but_small_difference_and_xstack_has_none() -> None:
    rng = np.random.default_rng(8)
    quiet = [record(_base_curve() + rng.normal(0, 0.001, len(STEPS)), 0.80 + rng.normal(0, 0.0005), seed=i)
             for i in range(10)]  # seeds that agree to 0.1%
    loss = np.mean([[p.loss for p in s.loss_curve] for s in quiet], axis=0)
    shifted = record(loss * 1.03, 0.80, seed=99)  # +3%: far outside the seeds' noise, inside NCSU's 5%
    v = calibrated_loss_window(shifted, quiet, PROTOCOL)
    assert v.passed is True and "never narrower than +-5%" in v.rule, v.explain()
    assert calibrated_curve(shifted, quiet, PROTOCOL).passed is True
    xstack = load_protocol("xstack")  # bars from the seeds' spread alone
    assert calibrated_loss_window(shifted, quiet, xstack).passed is False
    assert calibrated_loss_window(record(loss * 1.06, 0.80, seed=99), quiet, PROTOCOL).passed is False


def _with_norms(run: RunRecord, grads: np.ndarray, params: np.ndarray) -> RunRecord:
    vals = [[i + 1, float(g), float(w)] for i, (g, w) in enumerate(zip(grads, params))]
    return run.model_copy(update={"probe": {"grad_norms": {"source": "torch optimizer.step", "values": vals}}})


def test_scale_free_gradient_norm_ignores_the_weights_scale_not_the_gradients() -> None:
    # Behind a normalisation layer, weights 1.6x larger give gradients 1.6x smaller: ||g|| x ||theta|| stays.
    rng = np.random.default_rng(9)
    base = [_with_norms(s, _grad_curve(rng), np.full(300, 20.0)) for s in seeds()]
    loss = np.mean([[p.loss for p in s.loss_curve] for s in base], axis=0)
    other_init = _with_norms(record(loss, 0.80, seed=99), _grad_curve(rng) / 1.6, np.full(300, 32.0))
    v = calibrated_curve(other_init, base, PROTOCOL)
    assert v.passed is True and "scale-free gradient-norm curve" in v.summary, v.explain()
    summed = _with_norms(record(loss, 0.80, seed=99), 1.6 * _grad_curve(rng), np.full(300, 20.0))
    assert calibrated_curve(summed, base, PROTOCOL).passed is False
    # the first 20% of steps (the init transient) is not judged
    transient = _grad_curve(rng)
    transient[:50] *= 3.0
    v = calibrated_curve(_with_norms(record(loss, 0.80, seed=99), transient, np.full(300, 20.0)), base, PROTOCOL)
    assert v.passed is True and v.details["grad_norm"]["band"]["steps"][0] > 0.2 * 300


def test_an_undecided_check_names_the_extend_command_that_would_decide(tmp_path) -> None:
    from ladder.baselines.store import Baseline, BaselineMeta
    from ladder.checks import CheckContext
    from ladder.checks.l1 import metric

    base = [record(_base_curve(), m, seed=i) for i, m in enumerate((0.80, 0.81, 0.79))]
    meta = BaselineMeta(name="b", version=1, created_at=0.0, profile="reference", platform="cpu", seeds=[0, 1, 2],
                        full_seeds=[], spec_sha256="", protocol="ncsu")
    ctx = CheckContext(run=record(_base_curve(), 0.86, seed=9), protocol=PROTOCOL,
                       baseline=Baseline(tmp_path, meta, base, []), expected_platform="cpu")
    c = metric(ctx)
    more = c.details["calibrated"]["more_seeds"]
    assert c.status == "undecided" and more >= 1
    assert f"(ladder baseline extend --seeds {3 + more})" in c.evidence
