"""L2: the run really computed on the target device, the same way as the baseline.

Each check reads the merged probe report (`RunRecord.probe`, see ladder.runs.probe_report), the parsed log
and, where it compares, the baseline's run of the same kind, which the probe measured the same way: a
port fails for what the reference does not do (reads it does not make, graphs it does not keep
compiling, items it does not skip, hyperparameters it does not use), never for an absolute count.
Thresholds come only from `protocol.l2`. A check that cannot measure says `not_checked` (or
`not_applicable` where the fault it looks for cannot exist in this run) with the reason; never passed.

Expected platforms and the probe facts that meet them:
  cpu      torch tensors seen in forward calls are all on `cpu`
  cuda     ... all on `cuda`
  xla      ... all on `xla`, whatever PJRT device backs it (PJRT_DEVICE=CPU is fine), and XLA
           executed at least one graph
  tpu      as xla, and torch_xla's runtime device type is TPU
  jax-cpu / jax-gpu / jax-tpu   jax.default_backend() is cpu / gpu (cuda, rocm) / tpu
"""

from __future__ import annotations

import bisect
import json
import math
from collections import Counter
from pathlib import Path
from typing import Any

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.replay import replay
from ladder.checks.results import CheckResult
from ladder.runs.probe_report import classify_aten, compile_growth, logged_steps_per_step, read_rates
from ladder.runs.optimizers import timelines
from ladder.runs.records import RunRecord

L = "L2"
_JAX_GPU = {"gpu", "cuda", "rocm"}
# Optimizer settings that choose an implementation, not the optimisation: never compared.
_IMPLEMENTATION = {"foreach", "fused", "capturable", "differentiable", "n_params", "tensors", "name"}


def _result(name: str, ok: bool, measured: Any, threshold: Any, evidence: str,
            details: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult(level=L, name=name, status="passed" if ok else "failed", measured=measured,
                       threshold=threshold, evidence=evidence, details=details or {})


def _no_probe(name: str) -> CheckResult:
    return not_checked(L, name, "no probe report for this run (was it captured with the probe injected?)")


def _not_applicable(name: str, why: str) -> CheckResult:
    return CheckResult(level=L, name=name, status="not_applicable", evidence=why)  # type: ignore[arg-type]


def _unfinished(run: RunRecord) -> str | None:
    if run.ended_at is None:
        return "the run never finished (ladder was stopped mid-run)"
    if run.timed_out:
        return "the run timed out"
    if run.exit_code != 0:
        return f"the run exited with code {run.exit_code}: its device facts are incomplete"
    return None


def total_steps(run: RunRecord) -> int:
    probe_steps = (run.probe or {}).get("optimizer_steps", 0) or 0
    log_steps = run.loss_curve[-1].step if run.loss_curve else 0
    return max(probe_steps, log_steps, 0)


def warmup_end(ctx: CheckContext, steps: int) -> int:
    r = ctx.protocol.l2
    return max(r.warmup_steps, math.ceil(r.warmup_fraction * steps))


def _measurable(ctx: CheckContext, name: str) -> CheckResult | None:
    """not_checked when the run has no probe report or did not finish (its device facts are incomplete)."""
    if ctx.run.probe is None:
        return _no_probe(name)
    why = _unfinished(ctx.run)
    return not_checked(L, name, why) if why else None


def _baseline_probe(ctx: CheckContext, name: str) -> tuple[RunRecord | None, CheckResult | None]:
    ref = ctx.reference()
    if ref is None:
        return None, not_checked(L, name, "no baseline run of this kind to compare with")
    if ref.probe is None:
        return None, not_checked(L, name, "the baseline run has no probe report (re-record the baseline)")
    return ref, None


# ---------------------------------------------------------------- platform

def _observed(probe: dict[str, Any]) -> dict[str, list[str]]:
    p = probe.get("platforms") or {}
    return {"torch": list(p.get("torch") or []), "xla": list(p.get("xla") or []), "jax": list(p.get("jax") or [])}


def _first_seen(probe: dict[str, Any], dev: str, started_at: float) -> str:
    f = ((probe.get("torch_devices") or {}).get("first_seen") or {}).get(dev)
    return "" if not f else f" (first: {f.get('module')} {f.get('what')}s at +{f['t'] - started_at:.1f}s)"


def before_training(probe: dict[str, Any], want: str) -> set[str]:
    """Devices other than `want` whose every sampled forward call came before the run's first optimizer step,
    where `want`'s came after it too: computation before training (a dry run that sizes lazy layers on a host
    batch, a model evaluated before it moves to its device), not a fallback of the training or of its evaluations
    (those are sampled at their steps). Empty for a probe without the steps (older reports)."""
    last = (probe.get("torch_devices") or {}).get("last_step") or {}
    if not probe.get("optimizer_steps") or not last.get(want):
        return set()
    return {d for d, step in last.items() if d != want and step == 0}


def _before_words(probe: dict[str, Any], devs: set[str], started_at: float) -> str:
    return "; ".join(f"{d}{_first_seen(probe, d, started_at)} only before the first optimizer step (computation "
                     "before training, not a fallback)" for d in sorted(devs))


@register(L, "platform")
def platform(ctx: CheckContext) -> CheckResult:
    name = "platform"
    probe = ctx.run.probe
    if probe is None:
        return _no_probe(name)
    exp = ctx.expected_platform
    seen = _observed(probe)
    torch_set, jax_set = set(seen["torch"]), set(seen["jax"])

    def where(dev: str) -> str:
        return _first_seen(probe, dev, ctx.run.started_at)

    if exp in ("cpu", "cuda", "xla", "tpu"):
        want = "xla" if exp == "tpu" else exp
        if not torch_set:
            return CheckResult(level=L, name=name, status="not_checked", threshold=exp, measured=seen,
                               evidence="no torch module forward call was observed, so tensor devices are unknown")
        early = before_training(probe, want)
        wrong = sorted(torch_set - {want} - early)
        if wrong:
            ev = f"expected {exp}: tensors on {', '.join(d + where(d) for d in wrong)}"
            if want == "xla" and "torch_xla" in (probe.get("frameworks") or {}):
                ev += f"; torch_xla was imported and executed {probe.get('xla_executions', 0)} graphs"
            return _result(name, False, seen, exp, ev + " — a silent CPU fallback" if "cpu" in wrong else ev)
        if want == "xla" and not probe.get("xla_executions"):
            return _result(name, False, seen, exp, "tensors were on xla but XLA executed no graph")
        if exp == "tpu" and set(seen["xla"]) != {"TPU"}:
            return _result(name, False, seen, exp, f"xla tensors, but the PJRT device was {seen['xla'] or 'unknown'}, not TPU")
        backing = f" (PJRT device {', '.join(seen['xla'])})" if want == "xla" and seen["xla"] else ""
        return _result(name, True, seen, exp, f"all sampled parameters and inputs on {want}{backing}"
                       + (f" from the first optimizer step on; {_before_words(probe, early, ctx.run.started_at)}"
                          if early else ""))
    if exp.startswith("jax-"):
        want = exp[4:]
        if not jax_set:
            return CheckResult(level=L, name=name, status="not_checked", threshold=exp, measured=seen,
                               evidence="no JAX backend was started in any process")
        ok_set = _JAX_GPU if want == "gpu" else {want}
        if not jax_set <= ok_set:
            devices = ", ".join((probe.get("platforms") or {}).get("jax_devices") or []) or "unknown"
            return _result(name, False, seen, exp, f"expected {exp}: jax.default_backend() was "
                           f"{', '.join(sorted(jax_set))} (device platforms: {devices})"
                           + (" — a silent CPU fallback" if "cpu" in jax_set else ""))
        return _result(name, True, seen, exp, f"jax.default_backend() == {', '.join(sorted(jax_set))}")
    return not_checked(L, name, f"unknown expected platform {exp!r}; use cpu, cuda, xla, tpu, jax-cpu, jax-gpu or jax-tpu")


# ---------------------------------------------------------------- CPU fallback ops

@register(L, "cpu_fallback")
def cpu_fallback(ctx: CheckContext) -> CheckResult:
    name = "cpu_fallback"
    probe = ctx.run.probe
    if probe is None:
        return _no_probe(name)
    r = ctx.protocol.l2
    want = {"xla": "xla", "tpu": "xla", "cuda": "cuda"}.get(ctx.expected_platform)
    on = set(_observed(probe)["torch"])
    early = before_training(probe, want) if want else set()
    if want in on and "cpu" in on and "cpu" not in early:
        # the model works on its device, and some of its forward calls take CPU tensors: part of the computation
        # (an evaluation on a host copy, a module left behind) falls back to the CPU; a run with nothing on its
        # device is the platform check's
        return _result(name, False, sorted(on), want,
                       f"module forward calls on cpu{_first_seen(probe, 'cpu', ctx.run.started_at)} beside {want}"
                       f"{_first_seen(probe, want, ctx.run.started_at)}: part of the computation runs on the CPU")
    if "torch_xla" not in (probe.get("frameworks") or {}):
        return _not_applicable(name, "no PyTorch/XLA in the run: it has no aten:: fallback to count (a run that "
                                     "left its device fails the platform check)")
    cls = classify_aten(probe.get("aten_counters") or {}, r.fallback_allow, r.host_sync_ops)
    steps = max(total_steps(ctx.run), 1)
    bad = cls["fallback"]
    if bad:
        ops = ", ".join(f"{k} x{v} ({v / steps:.2f}/step)" for k, v in sorted(bad.items(), key=lambda kv: -kv[1]))
        return _result(name, False, bad, r.fallback_allow, f"CPU fallback ops over {steps} steps: {ops}", cls)
    return _result(name, True, {}, r.fallback_allow, "no unexpected aten:: counters"
                   + (f" (allowed: {cls['allowed']})" if cls["allowed"] else "")
                   + (f"; {_before_words(probe, early, ctx.run.started_at)}" if early else ""), cls)


# ---------------------------------------------------------------- recompilation

@register(L, "recompilation")
def recompilation(ctx: CheckContext) -> CheckResult:
    """Compilation must stop: a faithful program compiles while it warms up, once more for evaluation and
    perhaps for its last step, and then runs what it compiled. A program whose set of graphs keeps
    growing compiles in the second half of its training steps too. The rule counts the distinct steps
    of the second half (after warm-up, outside evaluation, before the last step) at which new graphs
    appeared, per process, and allows what the reference does there plus [l2].max_late_compile_steps.
    It does not depend on the program's schedule: only on where in training the compiles fall."""
    name = "recompilation"
    probe = ctx.run.probe
    early = _measurable(ctx, name)
    if early:
        return early
    rules = ctx.protocol.l2
    steps = total_steps(ctx.run)
    w = warmup_end(ctx, steps)
    growth = [g for g in compile_growth(ctx.run, w) if g.steps >= 2]
    events = probe.get("compile_events") or []
    gave_up = [e for e in events if e["source"] == "dynamo" and e["kind"] == "recompile_limit"]
    problems: list[str] = []
    if gave_up:  # whenever it happens: from then on the function runs uncompiled
        e = gave_up[0]
        problems.append(f"torch.compile gave up on {e['function']} at step {e.get('step')}: {e['cause']} "
                        "(it recompiled on every call until the limit, then ran eagerly)")
    ref = ctx.reference()
    ref_growth = compile_growth(ref, warmup_end(ctx, total_steps(ref))) if ref is not None and ref.probe else []
    quiet = rules.max_late_compile_steps
    rewarm: dict[int, list[int]] = {}  # id(growth) -> its second-half steps explained by a rate change
    late: dict[int, list[int]] = {}  # id(growth) -> the rest: the steps judged
    for g in [*growth, *ref_growth]:
        rewarm[id(g)] = g.after_rate_change(quiet)
        late[id(g)] = [s for s in g.second_half_steps if s not in rewarm[id(g)]]
    ref_late = max((len(late[id(g)]) for g in ref_growth), default=0)
    ref_rep = max((len(g.eval_repeat_steps) for g in ref_growth), default=0)
    allowed = ref_late + rules.max_late_compile_steps
    rep = max(growth, key=lambda g: len(g.eval_repeat_steps), default=None)
    if rep is not None and len(rep.eval_repeat_steps) > ref_rep + rules.max_late_compile_steps:
        fns = [str(e.get("function") or e.get("source")) for e in rep.eval_repeat_events]
        top = max(set(fns), key=fns.count)
        problems.append(
            f"the evaluation compiled again at {len(rep.eval_repeat_steps)} later evaluations (after steps "
            f"{', '.join(map(str, rep.eval_repeat_steps[:8]))}), against {ref_rep} in the reference (allowed "
            f"{ref_rep + rules.max_late_compile_steps}); again and again: {top} ({fns.count(top)}x) — a function "
            "built anew at each evaluation (a jit inside the evaluation function, a closure over the parameters)")
    # the set of graphs must stay small, not only stop growing: graphs keyed on a value that cycles (a ring
    # buffer's slot, the step modulo k) are all built within the first cycle, and then only reused
    built = {id(g): [s for s in g.train_steps if s >= 1] for g in [*growth, *ref_growth]}
    ref_built = max((len(built[id(g)]) for g in ref_growth), default=0)
    many = max(growth, key=lambda g: len(built[id(g)]), default=None)
    allowed_built = ref_built + rules.max_warmup_graph_steps
    worst = max(growth, key=lambda g: len(late[id(g)]), default=None)
    at = late[id(worst)] if worst is not None else []
    measured = {"late_compile_steps": len(at),
                "first_half_compiles": worst.first_half if worst else 0,
                "eval_recompile_steps": len(rep.eval_repeat_steps) if rep else 0,
                "graph_building_steps": len(built[id(many)]) if many is not None else 0}
    threshold = {"allowed_late_compile_steps": allowed, "reference_late_compile_steps": ref_late,
                 "warmup_end_step": w, "allowed_graph_building_steps": allowed_built}
    if worst is not None and len(at) > allowed:
        fns = [e.get("function") or e["source"] for e in worst.events if e.get("step") in at]
        top = max(set(fns), key=fns.count) if fns else "?"
        causes = [e.get("cause") for e in worst.events if e.get("cause")]
        problems.append(
            f"new graphs kept appearing in the second half of training: at {len(at)} different steps "
            f"({', '.join(map(str, at[:8]))}{'...' if len(at) > 8 else ''}) of steps {worst.steps // 2 + 1}-"
            f"{worst.steps - 1}, against {ref_late} in the reference (allowed {allowed}); most compiled: {top} "
            f"({fns.count(top)}x)" + (f"; cause: {causes[0]}" if causes else "")
            + " — shapes or Python values that change per step are baked into the graph")
    elif many is not None and len(built[id(many)]) > allowed_built:  # growth, when there is, says it already
        steps_built = built[id(many)]
        problems.append(
            f"{len(steps_built)} training steps built new graphs ({', '.join(map(str, steps_built[:10]))}"
            f"{'...' if len(steps_built) > 10 else ''}), against {ref_built} in the reference (allowed "
            f"{allowed_built}): a step needs a few graphs, built once; one per step of a cycle means a Python value "
            "that changes per step (an index, a counter) is baked into the graph")
    details = {"processes": [{"pid": g.pid, "steps": g.steps, "first_half": g.first_half,
                              "second_half_steps": late[id(g)][:50], "allowed_events": g.allowed,
                              "after_rate_change": rewarm[id(g)][:50], "rate_changes": g.rate_changes[:50],
                              "graph_building_steps": built[id(g)][:50]}
                             for g in growth], "compiles": probe.get("compiles")}
    if problems:
        return _result(name, False, measured, threshold, "; ".join(problems), details)
    if not growth:
        return not_checked(L, name, "the probe saw no training steps to place compilations in")
    n_breaks = (probe.get("compiles") or {}).get("dynamo_graph_breaks", 0)
    note = f"; {n_breaks} torch.compile graph breaks" if n_breaks else ""
    rebuilt = rewarm[id(worst)] if worst is not None else []
    if rebuilt:
        note += (f"; new graphs at step(s) {', '.join(map(str, rebuilt[:8]))} right after a learning-rate change, "
                 f"while another change built none (rate changes at {', '.join(map(str, worst.rate_changes[:8]))}): "
                 "the graphs are not keyed on the rate; a one-off the new value caused, not growth")
    return _result(name, True, measured, threshold,
                   f"compilation stopped: {measured['late_compile_steps']} step(s) with new graphs in the second "
                   f"half of training (allowed {allowed}), {measured['first_half_compiles']} after warm-up in the "
                   f"first half{note}", details)


# ---------------------------------------------------------------- host reads

@register(L, "host_syncs")
def host_syncs(ctx: CheckContext) -> CheckResult:
    """Reads of device values into Python per training step (`.item()`, `.cpu()`, `float()`, a jax.Array
    read, a host callback), counted by the probe on every platform, evaluation and the end of the run
    apart, per process (the busiest counts). A port fails only for reads the reference does not make:
    above the reference's rate x [l2].host_read_slack + [l2].host_read_margin."""
    name = "host_syncs"
    early = _measurable(ctx, name)
    if early:
        return early
    if ctx.expected_platform == "cpu":
        # torch on the CPU is the host itself: a read into Python moves nothing and waits for no device, so
        # there is no round-trip to count (a per-step `.tolist()` of CPU indices failed a benign CPU port).
        # A port that left the CPU fails `platform` instead.
        return _not_applicable(name, "the target is the CPU, the host itself: a read into Python is no "
                                     "device round-trip")
    # the port's reads of tensors already in host memory move nothing from its device; the CPU reference's reads
    # all stand for what its device would read, and so do a port's whose tensors never left the CPU (it fails
    # `platform`; its reads here are still those its device would make)
    off_host = bool(set(_observed(ctx.run.probe or {})["torch"]) - {"cpu"})
    mine = read_rates(ctx.run, device_only=off_host)
    if mine is None:
        return not_checked(L, name, "the run's probe did not count host reads (written by an older ladder)")
    ref, missing = _baseline_probe(ctx, name)
    if missing:
        return missing
    theirs = read_rates(ref)
    if theirs is None:
        return not_checked(L, name, "the baseline's probe did not count host reads (re-record the baseline)")
    if not mine:
        return not_checked(L, name, "the probe saw fewer than 2 training steps in every process")
    rules = ctx.protocol.l2
    worst = max(mine, key=lambda r: r.per_step)
    base = max((r.per_step for r in theirs), default=0.0)
    bound = base * rules.host_read_slack + rules.host_read_margin
    # a port whose one step call runs several of the program's steps (a scan over stacked batches) reads per
    # call what the reference reads over those steps: its rate is per logged step, relative to the reference's
    cover_run, cover_ref = logged_steps_per_step(ctx.run), logged_steps_per_step(ref)
    cover = cover_run / cover_ref if cover_run and cover_ref else 1.0
    cover = cover if cover >= rules.host_read_steps_per_call else 1.0
    rate = worst.per_step / cover
    ok = rate <= bound
    ref_desc = max(theirs, key=lambda r: r.per_step).describe() if theirs else "no training steps"
    ev = (f"run: {worst.describe()}{' in pid ' + str(worst.pid) if len(mine) > 1 else ''}"
          + (f", each step call covering {cover:.3g} of the log's training steps (relative to the reference's calls): "
             f"{rate:.3f} reads per logged step" if cover > 1 else "")
          + f"; reference: {ref_desc}; bound {base:.3f} x {rules.host_read_slack} + {rules.host_read_margin} = "
            f"{bound:.3f}")
    if not ok:
        ev = "the port reads device values the reference does not read: " + ev
    return _result(name, ok, round(rate, 4), round(bound, 4), ev,
                   {"run": [r.__dict__ for r in mine], "baseline": [r.__dict__ for r in theirs]})


# ---------------------------------------------------------------- numerics

FROZEN_MIN = 3  # frozen updates beyond the reference's before a port is said to skip steps
FROZEN_MARGIN = 0.02  # ... and beyond the reference's share of judged steps by this much


HALF = ("bfloat16", "float16", "half")


def _data_dtypes(probe: dict[str, Any] | None) -> tuple[dict[str, int], set[str], dict[str, int]]:
    """(floating-point host tensors the torch probe saw sent to a device, by the dtype they arrived in -> count;
    the floating dtypes of the sampled forward calls' inputs; the floating dtypes of the JAX training steps' data
    arguments, neither parameters nor shaped as one -> count over traces), all processes."""
    sent, inputs, args = {}, set(), {}
    for p in (probe or {}).get("processes") or []:
        t = p.get("torch") or {}
        for d, n in (t.get("h2d_dtypes") or {}).items():
            sent[d] = sent.get(d, 0) + int(n)
        inputs.update(t.get("input_dtypes") or {})
        for f in (p.get("jax") or {}).get("functions") or []:
            if f.get("train") or f.get("grad"):
                for d, n in (f.get("data_dtypes") or {}).items():
                    args[d] = args.get(d, 0) + int(n)
    return sent, inputs, args


def _precision(probe: dict[str, Any] | None) -> tuple[set[str], set[str], dict[str, int]]:
    """(autocast regions, floating parameter dtypes) the torch probe saw in sampled forward calls, and the
    floating operand dtypes of the matmuls and convolutions the JAX probe saw traced in training steps (dtype ->
    count), all processes."""
    autocast, dtypes, compute = set(), set(), {}
    for p in (probe or {}).get("processes") or []:
        t = p.get("torch") or {}
        autocast.update((t.get("autocast") or {}).keys())
        dtypes.update(d for d in (t.get("param_dtypes") or {}) if d.startswith(("float", "bfloat", "half")))
        for f in (p.get("jax") or {}).get("functions") or []:
            if f.get("train") or f.get("grad"):
                for d, n in (f.get("compute") or {}).items():
                    if d.startswith(("float", "bfloat", "cast:")):
                        compute[d] = compute.get(d, 0) + int(n)
    return autocast, dtypes, compute


def _state_dtypes(probe: dict[str, Any] | None) -> dict[str, int]:
    """The floating dtypes the run's optimizers keep their state in (dtype -> elements, every optimizer record)."""
    out: dict[str, int] = {}
    for rec in (probe or {}).get("optimizers") or []:
        for d, n in (rec.get("state_dtypes") or {}).items():
            out[d] = out.get(d, 0) + int(n)
    return out


def state_precision_difference(probe: dict[str, Any] | None, ref_probe: dict[str, Any] | None) -> str | None:
    """An optimizer whose state (momentum, Adam's moments) is kept in a half-precision dtype where the reference's
    is not (`optax.adam(mu_dtype=jnp.bfloat16)`, moments cast down to save memory): every update is computed from
    rounded moments. None when either side recorded no state."""
    mine, theirs = _state_dtypes(probe), _state_dtypes(ref_probe)
    if not mine or not theirs or set(theirs) & set(HALF):
        return None
    low = {d: n for d, n in mine.items() if d in HALF}
    if not low:
        return None
    return ("the optimizer's state kept in " + ", ".join(f"{d} ({n} of {sum(mine.values())} values)"
                                                        for d, n in sorted(low.items()))
            + f", where the reference's is {', '.join(sorted(theirs))}: each update computed from rounded moments")


def precision_difference(probe: dict[str, Any] | None, ref_probe: dict[str, Any] | None) -> str | None:
    """A port that lowers the precision of a full-precision reference: an autocast region or a half-precision
    parameter dtype where the reference's forward calls ran in float32 (torch.autocast(dtype=bfloat16) kept
    from a GPU recipe, a model cast to bf16), or half-precision operands in the matmuls and convolutions of a
    JAX training step (Flax layers built with dtype=bfloat16 over float32 parameters). A reference already in
    mixed precision may change its half dtype (fp16 autocast on CUDA, bf16 on a TPU): not judged. None when
    neither applies, or when either side's probe saw no forward call and no training step's matmul."""
    (ac, dt, cd), (rac, rdt, rcd) = _precision(probe), _precision(ref_probe)
    if not (ac or dt or cd) or not (rac or rdt or rcd):
        return None
    if rac - {"off"} or (rdt | {d.removeprefix("cast:") for d in rcd}) & set(HALF):
        return None
    out = []
    if ac - {"off"}:
        out.append(f"autocast {', '.join(sorted(rac)) or 'off'} -> {', '.join(sorted(ac))}")
    if dt & set(HALF):
        out.append(f"parameters {', '.join(sorted(rdt)) or 'float32'} -> {', '.join(sorted(dt))}")
    operands = {d: n for d, n in cd.items() if not d.startswith("cast:")}
    low = {d: n for d, n in operands.items() if d in HALF}
    ref = (f"the reference's: {', '.join(sorted(d for d in rcd if not d.startswith('cast:')))}" if rcd else
           f"the reference: parameters {', '.join(sorted(rdt)) or 'float32'}, autocast off")
    if low:
        out.append("training-step matmul and convolution operands in " +
                   ", ".join(f"{d} ({n} of {sum(operands.values())})" for d, n in sorted(low.items())) + f" ({ref})")
    casts = {d.removeprefix("cast:"): n for d, n in cd.items()
             if d.startswith("cast:") and d.removeprefix("cast:") in HALF}
    if casts and not low:
        out.append("float32 values cast down in the training step: " +
                   ", ".join(f"{n} to {d}" for d, n in sorted(casts.items())) + f" ({ref})")
    (sent, inputs, args), (rsent, rinputs, rargs) = _data_dtypes(probe), _data_dtypes(ref_probe)
    rounded = {d: n for d, n in sent.items() if d in HALF}
    full = rinputs | set(rargs)  # what the reference's model receives: torch's forward inputs, JAX's step data
    ref_full_precision = bool(full) and not (full | set(rsent)) & set(HALF)
    if rounded and ref_full_precision:
        # the TPU input-pipeline habit: batches sent as bfloat16 to halve the bytes, upcast on the device. The
        # model computes in float32 on data rounded to an 8-bit mantissa (the targets too): invisible in the
        # curves, a changed computation all the same
        out.append("floating-point data sent to the device in " +
                   ", ".join(f"{d} ({n} transfers)" for d, n in sorted(rounded.items())) +
                   f", where the reference's model receives {', '.join(sorted(full))}: every value rounded on "
                   "the way" + (f" (the port's model then receives {', '.join(sorted(inputs))})" if inputs else ""))
    low_args = {d: n for d, n in args.items() if d in HALF}
    if low_args and ref_full_precision:
        # the same habit in JAX: the batch put on the device as bfloat16 and upcast inside the jitted step, whose
        # matmuls then take float32 operands
        out.append("floating-point data passed to the training step in " +
                   ", ".join(f"{d} ({n} argument(s))" for d, n in sorted(low_args.items())) +
                   f", where the reference's model receives {', '.join(sorted(full))}: every value rounded before "
                   "the step" + (f" (its other data arguments: {', '.join(sorted(set(args) - set(low_args)))})"
                                 if set(args) - set(low_args) else ""))
    return ("the model computes in a lower precision than the reference (" + "; ".join(out) + ")") if out else None


def frozen_updates(probe: dict[str, Any] | None) -> tuple[int, int, int | None]:
    """Optimizer steps after which the parameters were bit for bit what they were before, though the gradient
    was not zero: the update was dropped (a bad-batch or non-finite guard written inside the step, as in
    `jnp.where(ok, new, old)`, which no optimizer hook sees). Read off the recorded norms: the parameter norm
    the optimizer received at step s + 1 equals the one at step s. Returns (frozen, judged pairs of
    consecutive recorded steps, first frozen step); norms thinned to every k-th step give no pairs."""
    values = ((probe or {}).get("grad_norms") or {}).get("values") or []
    frozen = judged = 0
    first = None
    for a, b in zip(values, values[1:]):
        try:
            step_a, step_b = int(a[0]), int(b[0])
            g, p0, p1 = float(a[1]), float(a[2]), float(b[2])
        except (TypeError, ValueError, IndexError):
            continue
        if step_b != step_a + 1 or not all(math.isfinite(x) for x in (g, p0, p1)):
            continue
        judged += 1
        if p1 == p0 and g > 0:
            frozen += 1
            first = step_a if first is None else first
    return frozen, judged, first


@register(L, "numerics")
def numerics(ctx: CheckContext) -> CheckResult:
    name = "numerics"
    run = ctx.run
    bad_loss = list(run.nonfinite_losses) + [p for p in run.loss_curve if not math.isfinite(p.loss)]
    bad_evals = [e for e in run.evals if any(not math.isfinite(v) for v in e.values.values())]
    probe = run.probe or {}
    bad_params = probe.get("nonfinite_params") or []
    gn = ((probe.get("grad_norms") or {}).get("values")) or []
    bad_grads = [p for p in gn if isinstance(p[1], str) or (isinstance(p[1], float) and not math.isfinite(p[1]))]
    skipped = int(probe.get("skipped_steps") or 0)
    ref = ctx.reference()
    ref_skipped = int(((ref.probe if ref else None) or {}).get("skipped_steps") or 0)
    problems = []
    if bad_loss:
        first = min(bad_loss, key=lambda p: p.step)
        problems.append(f"non-finite loss ({first.loss}) first at step {first.step}, {len(bad_loss)} logged")
    if run.metric is not None and not math.isfinite(run.metric):
        problems.append(f"the headline metric is {run.metric}")
    if bad_evals:
        problems.append(f"non-finite evaluation values at step {bad_evals[0].step}")
    if bad_params:
        problems.append(f"non-finite parameters at exit: {', '.join(bad_params[:5])}")
    if bad_grads:
        problems.append(f"non-finite gradient norm at step {bad_grads[0][0]} ({len(bad_grads)} of the recorded steps): "
                        "the loss line may look finite while the update is not")
    if skipped > ref_skipped:
        problems.append(f"{skipped} optimizer steps skipped for non-finite gradients (GradScaler), the reference "
                        f"skipped {ref_skipped}")
    precision = precision_difference(probe, ref.probe if ref else None)
    if precision:
        problems.append(precision)
    state_precision = state_precision_difference(probe, ref.probe if ref else None)
    if state_precision:
        problems.append(state_precision)
    frozen, judged, first_frozen = frozen_updates(probe)
    ref_frozen, ref_judged, _ = frozen_updates(ref.probe if ref else None)
    ref_share = ref_frozen / ref_judged if ref_judged else 0.0
    if judged and frozen >= ref_frozen + FROZEN_MIN and frozen / judged > ref_share + FROZEN_MARGIN:
        ref_desc = (f"the reference {ref_frozen} of {ref_judged}" if ref_judged else
                    "the reference recorded no consecutive steps to compare (its norms were thinned)")
        problems.append(f"{frozen} of {judged} optimizer steps left the parameters bit for bit unchanged with a "
                        f"non-zero gradient, first at step {first_frozen}: updates dropped silently (a guard that "
                        f"skips bad batches or non-finite steps inside the step?); {ref_desc}")
    measured = {"nonfinite_losses": len(bad_loss), "nonfinite_params": len(bad_params),
                "nonfinite_grad_norms": len(bad_grads), "skipped_steps": skipped, "frozen_updates": frozen}
    if problems:
        return _result(name, False, measured, 0, "; ".join(problems))
    why = _unfinished(run)
    if why:
        return not_checked(L, name, f"{why}; nothing non-finite in what it logged")
    if run.probe is None:
        return _no_probe(name)
    checked = ["losses"] + (["gradient norms"] if gn else []) + (
        ["parameters"] if probe.get("nonfinite_params") is not None and any(
            (p.get("options") or {}).get("param_nonfinite") for p in probe.get("processes", [])) else [])
    return _result(name, True, measured, 0, f"all {run.loss_lines or len(run.loss_curve)} logged {', '.join(checked)} "
                                            f"finite; {skipped} skipped steps (reference {ref_skipped})"
                                            + (f"; {frozen} of {judged} updates left the parameters unchanged "
                                               f"(reference {ref_frozen} of {ref_judged})" if judged else ""))


# ---------------------------------------------------------------- evaluation complete

def _eval_functions(run: RunRecord, need_evals: bool) -> list[tuple[dict[str, Any], dict[int, int]]]:
    """The jitted functions of a JAX run's main process called only at evaluation steps (from the log's eval lines)
    or after the last training step, each with its rows per step; none without a step clock, or without logged
    evaluations when `need_evals`. Training steps (the optimizer update traced inside) are left out."""
    from ladder.runs.probe_report import eval_steps, main_process

    main = main_process(run.probe or {})
    if main is None or not (main.get("jax") or {}).get("functions"):
        return []
    evals = eval_steps(run, main)
    steps = int((main.get("clock") or {}).get("steps") or 0)
    if not steps or (need_evals and not evals):
        return []
    out = []
    for f in main["jax"]["functions"]:
        if f.get("train"):
            continue
        rows = {int(s): int(r) for s, _, r in f.get("by_step") or []}
        if rows and not {s for s in rows if s not in evals and s < steps}:  # never called during training
            out.append((f, rows))
    return out


def probe_eval_items(run: RunRecord) -> list[int] | None:
    """Items the program evaluated, per evaluation, as the probe counted them: the batches a torch module in
    eval mode saw, or the rows of jitted functions called only at evaluation steps. None when it cannot tell."""
    windows = (run.probe or {}).get("eval_windows") or []
    if windows:
        return [int(w.get("items") or 0) for w in windows]
    per_eval: dict[int, int] = {}
    for _, rows in _eval_functions(run, need_evals=True):
        for s, r in rows.items():
            per_eval[s] = per_eval.get(s, 0) + r
    return [per_eval[s] for s in sorted(per_eval)] or None


def _eval_dropout(run: RunRecord) -> list[tuple[str, list[float]]]:
    """The jitted functions of a JAX run that run only at evaluation (as probe_eval_items finds them) and applied
    dropout there: (name, rates), from the probe's Flax dropout layers (the mask applied, not the input returned)."""
    return [(str(f.get("name")), list(f["dropout"]["on"])) for f, _ in _eval_functions(run, need_evals=False)
            if (f.get("dropout") or {}).get("on") and not f.get("grad")]


def _evaluated_with_dropout(run: RunRecord, ref: RunRecord) -> str | None:
    """Why the run's evaluations apply dropout (a Flax layer called with `deterministic=False`, `train=True`) where
    the reference's evaluate without it (its model switched to eval mode, or no evaluation function of its own
    applying dropout); None when they do not."""
    mine = _eval_dropout(run)
    if not mine or _eval_dropout(ref):
        return None
    if not (ref.probe or {}).get("eval_windows") and _has(ref, "Dropout"):
        return None  # a torch reference that evaluates without model.eval(): its dropout is on there too
    name, rates = mine[0]
    return (f"the evaluation applies dropout: {name}, called only at evaluations, masked with rate "
            f"{', '.join(f'{r:g}' for r in rates)} (a Flax Dropout called with deterministic=False or train=True), "
            "so every evaluation scores a randomly thinned network; the reference evaluates without dropout")


def _has(run: RunRecord, *module_names: str) -> bool:
    seen = set()
    for p in (run.probe or {}).get("processes") or []:
        seen.update((p.get("torch") or {}).get("modules") or [])
        seen.update((p.get("torch") or {}).get("module_types") or [])
    return any(any(m.startswith(n) for m in seen) for n in module_names)


def _eval_mode_steps(run: RunRecord) -> tuple[int, int, dict[str, Any]]:
    """(training steps taken while a module was still in eval mode, optimizer steps, the first such record), the
    busiest process's: the torch probe counts optimizer steps inside an evaluation window left open."""
    worst: tuple[int, int, dict[str, Any]] = (0, 0, {})
    for p in (run.probe or {}).get("processes") or []:
        rec = (p.get("torch") or {}).get("steps_in_eval_mode") or {}
        n, steps = int(rec.get("steps") or 0), int((p.get("clock") or {}).get("steps") or 0)
        if steps and n / steps > (worst[0] / worst[1] if worst[1] else -1):
            worst = (n, steps, rec)
    return worst


def _stale_grad_steps(run: RunRecord) -> tuple[int, int, int | None]:
    """(steps whose gradient still held the previous step's, steps judged, the first), the worst process's."""
    worst: tuple[int, int, int | None] = (0, 0, None)
    for p in (run.probe or {}).get("processes") or []:
        rec = (p.get("torch") or {}).get("stale_grad_steps") or {}
        n, judged = int(rec.get("steps") or 0), int(rec.get("judged") or 0)
        if judged and n / judged > (worst[0] / worst[1] if worst[1] else -1):
            worst = (n, judged, rec.get("first"))
    return worst


def schedule_stepped_first(run: RunRecord, ref: RunRecord, run_opt: dict[str, Any] | None = None,
                           ref_opt: dict[str, Any] | None = None, tol: float = 0.0) -> str | None:
    """Why the run's schedule runs one step ahead: a scheduler stepped before its optimizer's first step, where
    the reference's was not (the rate comparison allows a one-step shift, so this is told by the order itself).
    None when every optimizer step of the run ran at the reference's rate for that very step, within `tol`: the
    order is compensated (a schedule function shifted by one, lambda s: f(s - 1)) or the rate never changes."""
    def first(r: RunRecord) -> list[dict[str, Any]]:
        return [e for p in (r.probe or {}).get("processes") or []
                for e in (p.get("torch") or {}).get("schedule_before_step") or []]

    mine = first(run)
    if not mine or first(ref):
        return None
    if run_opt is not None and ref_opt is not None and _rates_aligned(run, ref, run_opt, ref_opt, tol):
        return None
    return (f"the learning-rate schedule ({mine[0].get('scheduler')}) is stepped before the optimizer's first "
            "step (scheduler.step() above optimizer.step()): its first value is skipped and every step runs at "
            "the next step's rate; the reference steps it after the optimizer")


def stale_gradients(run: RunRecord, ref: RunRecord, share: float) -> str | None:
    """Why the run's updates carry earlier gradients (zero_grad dropped: each step adds its gradient to all
    before it), beyond the reference's share of such steps by `share`; None when they do not, or when either
    side's probe judged no step (a hand-written update, an older probe)."""
    n, judged, first = _stale_grad_steps(run)
    rn, rjudged, _ = _stale_grad_steps(ref)
    if not judged or not rjudged or n < 3 or n / judged <= rn / rjudged + share:
        return None
    return (f"gradients accumulate across optimizer steps: at {n} of {judged} steps (from step {first}) the "
            f"gradient still held the previous step's (no zero_grad in between), so each update adds every "
            f"earlier gradient; the reference {rn} of {rjudged}")


def _trained_in_eval_mode(run: RunRecord, ref: RunRecord, share: float) -> str | None:
    """Why the run trained with its dropout or batch norm off (evaluation switched the model to eval mode and
    nothing switched it back), beyond the reference's share of such steps by `share`; None when it did not."""
    n, steps, rec = _eval_mode_steps(run)
    if n < 3 or not _has(run, "Dropout", "BatchNorm", "SyncBatchNorm"):
        return None
    rn, rsteps, _ = _eval_mode_steps(ref)
    ref_share = rn / rsteps if rsteps else 0.0
    if n / steps <= ref_share + share:
        return None
    return (f"{n} of {steps} training steps ran with {rec.get('module') or 'the model'} still in eval mode (from step "
            f"{rec.get('first')}: an evaluation switched it to eval mode and model.train() was not called back), so "
            f"its dropout or batch-norm layers did not train as they do in the reference ({rn} of {rsteps} steps)")


@register(L, "evaluation_complete")
def evaluation_complete(ctx: CheckContext) -> CheckResult:
    """Every evaluation the reference made, over as many items, in eval mode. Items come from the log when
    it prints them, else from the probe (torch: batches seen by a module in eval mode; JAX: rows given to
    jitted functions that run only at evaluation); eval mode from the probe's evaluation windows."""
    name = "evaluation_complete"
    ref = ctx.reference()
    if ref is None:
        return not_checked(L, name, "no baseline run of this kind to compare the evaluations with")
    why = _unfinished(ctx.run)
    if why:
        return not_checked(L, name, why)
    mine, theirs = ctx.run.evals, ref.evals
    measured: dict[str, Any] = {"events": len(mine), "items": [e.items for e in mine]}
    threshold: dict[str, Any] = {"events": len(theirs), "items": [e.items for e in theirs]}
    if len(mine) != len(theirs):
        return _result(name, False, measured, threshold,
                       f"{len(mine)} evaluation events, the baseline logged {len(theirs)}")
    rules = ctx.protocol.l2
    if rules.eval_items_must_match:
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a.items is not None and b.items is not None and a.items != b.items:
                return _result(name, False, measured, threshold,
                               f"evaluation {i + 1} (step {a.step}) covered {a.items} items, the baseline's {b.items}")
    how = "items from the log" if mine and all(e.items is not None for e in mine + theirs) else None
    ref_windows = (ref.probe or {}).get("eval_windows") or []
    run_is_torch = "torch" in ((ctx.run.probe or {}).get("frameworks") or {}) and not (
        "jax" in ((ctx.run.probe or {}).get("frameworks") or {}))
    if ref_windows and run_is_torch and ctx.run.probe is not None and not (ctx.run.probe.get("eval_windows")):
        if _has(ctx.run, "Dropout", "BatchNorm", "SyncBatchNorm"):
            return _result(name, False, measured, threshold,
                           "the run evaluated without switching its model to eval mode (model.eval() is missing): "
                           "its dropout or batch-norm layers stayed in training mode during evaluation; the "
                           f"reference did switch ({len(ref_windows)} evaluation windows)")
    left = _trained_in_eval_mode(ctx.run, ref, rules.eval_mode_steps_share)
    if left:
        return _result(name, False, measured, threshold, left)
    masked = _evaluated_with_dropout(ctx.run, ref)
    if masked:
        return _result(name, False, measured, threshold, masked)
    if how is None:
        a, b = probe_eval_items(ctx.run), probe_eval_items(ref)
        measured["probe_items"], threshold["probe_items"] = a, b
        if a is not None and b is not None:
            if len(a) == len(b) and any(x != y for x, y in zip(a, b)):
                i = next(k for k, (x, y) in enumerate(zip(a, b)) if x != y)
                return _result(name, False, measured, threshold,
                               f"evaluation {i + 1} covered {a[i]} items, the reference's {b[i]} (counted by the probe)")
            if sum(a) != sum(b) and len(a) != len(b):
                return _result(name, False, measured, threshold,
                               f"the evaluations covered {sum(a)} items in all, the reference's {sum(b)} (counted by the probe)")
            how = "items counted by the probe"
    if how is None:
        return _result(name, True, measured, threshold,
                       f"{len(mine)} evaluation events as in the baseline (cadence only: neither the log nor the probe "
                       "gives item counts for both runs)")
    return _result(name, True, measured, threshold, f"{len(mine)} evaluation events, {how} as in the baseline")


# ---------------------------------------------------------------- optimizer unchanged

_KEY_ALIASES = {"learning_rate": "lr"}
_NAME_ALIASES = {"scale_by_adam": "adam"}


def _neutral(v: Any) -> Any:
    return None if v in (0, 0.0, False, None) and not isinstance(v, list) else v


def shape_key(shape) -> str:  # noqa: ANN001 - any sequence of sizes
    """A tensor's framework-neutral shape: its sorted sizes, so torch's [out, in] and flax's [in, out] match."""
    return repr(tuple(sorted(int(x) for x in shape)))


def tensor_settings(o: dict[str, Any], ignore: list[str]) -> list[tuple[str, tuple[int, ...], str | None, dict[str, Any]]]:
    """One entry per parameter tensor: (framework-neutral shape key, shape, name, settings). The shape key is
    the sorted dimensions, so torch's [out, in] and flax's [in, out] kernels match; settings are the
    optimisation's hyperparameters in torch's words (lr and the protocol's ignored keys left out)."""
    framework = o.get("framework")
    cls_name = str(o.get("name", "?")).lower()
    out = []
    for g in o.get("param_groups") or []:
        h: dict[str, Any] = {}
        for k, v in g.items():
            k = _KEY_ALIASES.get(k, k)
            if k in ignore or k in _IMPLEMENTATION or k == "decay_mode":
                continue
            h[k] = v
        if "b1" in h and "b2" in h:
            h["betas"] = [h.pop("b1"), h.pop("b2")]
        # an optax group's name is its transformation; a torch group's "name" is the program's own label
        # ({"params": ..., "name": "no_decay"}), and the optimizer is the class
        label = cls_name if framework == "torch" else str(g.get("name") or cls_name).lower()
        name = _NAME_ALIASES.get(label, label)
        wd = _neutral(h.get("weight_decay"))
        h["weight_decay"] = wd
        if wd:
            if framework == "torch":
                mode = "decoupled" if name == "adamw" or g.get("decoupled_weight_decay") else "coupled"
            else:
                mode = g.get("decay_mode") or "coupled"
            h["weight_decay_mode"] = mode
        h.pop("decoupled_weight_decay", None)
        # AdamW is Adam with decoupled decay, and the decay's mode is compared on its own: one name for both
        # (optax's adamw, torch's AdamW, and scale_by_adam chained with add_decayed_weights after it)
        h["optimizer"] = "adam" if name == "adamw" else name
        settings = {k: _neutral(v) for k, v in h.items()}
        for tname, shape in g.get("tensors") or []:
            shape = tuple(int(x) for x in shape)
            out.append((shape_key(shape), shape, tname, settings))
    return out


def _settings_text(s: dict[str, Any]) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(s.items()) if v is not None and k != "optimizer") or "no decay"


def _unmatched_tensors(a: list, b: list) -> str:
    """Where the two sides optimize different numbers of tensors of a shape: how many more, and the tensors of
    that shape on each side by name (shapes, not names, match across frameworks). The run: a; the reference: b."""
    ka, kb = Counter(k for k, *_ in a), Counter(k for k, *_ in b)

    def names(entries: list, key: Any) -> str:
        found = [str(t) for k, _, t, _ in entries if k == key]
        return ", ".join(found[:4]) + (f" and {len(found) - 4} more" if len(found) > 4 else "") if found else "none"

    parts = []
    for key in sorted(set(ka) | set(kb), key=str):
        if ka[key] != kb[key]:
            shape = next(tuple(sh) for k, sh, *_ in a + b if k == key)
            side = "run" if ka[key] > kb[key] else "reference"
            parts.append(f"{abs(ka[key] - kb[key])} more of shape {shape} in the {side} (run: {names(a, key)}; "
                         f"reference: {names(b, key)})")
    return (f"the parameters differ: the reference optimizes {len(b)} tensors, the run {len(a)}: "
            + "; ".join(parts[:4]))


def _relayout(a: list, b: list, settings_key) -> tuple[str | None, str]:
    """The tensors only one side has, as a re-layout: (what, how their elements differ by setting). `what` is
    None unless both sides' unmatched tensors hold the same number of elements; the second part is empty when
    every setting (weight decay, betas, ...) covers as many elements on both sides: the same parameters, split
    or fused another way, optimized the same."""
    def numel(shape) -> int:
        return math.prod(int(x) for x in shape)

    total_a, total_b = sum(numel(sh) for _, sh, *_ in a), sum(numel(sh) for _, sh, *_ in b)
    if not a or not b or total_a != total_b:
        return None, ""
    per_a, per_b = Counter(), Counter()
    for entries, per in ((a, per_a), (b, per_b)):
        for _, sh, _, s in entries:
            per[settings_key(s)] += numel(sh)
    what = (f"laid out differently: {len(b)} reference tensor(s) of shapes "
            f"{', '.join(sorted({str(tuple(sh)) for _, sh, *_ in b}))} and {len(a)} in the run of shapes "
            f"{', '.join(sorted({str(tuple(sh)) for _, sh, *_ in a}))} hold the same {total_a} elements")
    off = []
    for key in sorted(set(per_a) | set(per_b)):
        if per_a[key] != per_b[key]:
            off.append(f"{_settings_text(json.loads(key))}: {per_b[key]} elements in the reference, {per_a[key]} "
                       "in the run")
    return what, "; ".join(off)


def optimizer_diff(mine: dict[str, Any], theirs: dict[str, Any], ignore: list[str],
                   notes: list[str] | None = None) -> list[str]:
    """Differences of the optimisation, tensor by tensor: the optimizer, each hyperparameter that
    differs (reference value -> port value, with the tensors it applies to), weight-decay coverage, and
    gradient clipping. Tensors laid out differently (a fused layer split in the port) are compared by their
    elements under each setting; an exact re-layout is added to `notes`, not a difference."""
    a, b = tensor_settings(mine, ignore), tensor_settings(theirs, ignore)
    diffs: list[str] = []
    if not a or not b:
        names = (str(mine.get("name", "?")).lower(), str(theirs.get("name", "?")).lower())
        if names[0] != names[1]:
            diffs.append(f"optimizer {names[1]} -> {names[0]}")
        return diffs
    opt_a = sorted({s["optimizer"] for *_, s in a})
    opt_b = sorted({s["optimizer"] for *_, s in b})
    if opt_a != opt_b:
        diffs.append(f"optimizer {'+'.join(opt_b)} -> {'+'.join(opt_a)}")
    shared = set.intersection(*[set(s) for *_, s in a + b]) if mine.get("framework") != theirs.get("framework") \
        else set.union(*[set(s) for *_, s in a + b])
    shared |= {"weight_decay", "weight_decay_mode", "update_clip"}

    def proj(entries):
        return Counter((k, json.dumps({kk: s.get(kk) for kk in sorted(shared) if kk != "optimizer"}, sort_keys=True))
                       for k, _, _, s in entries)

    count_a, count_b = Counter(k for k, *_ in a), Counter(k for k, *_ in b)
    if count_a != count_b:
        unmatched = {k for k in set(count_a) | set(count_b) if count_a[k] != count_b[k]}
        relayout, by_settings = _relayout([e for e in a if e[0] in unmatched], [e for e in b if e[0] in unmatched],
                                          lambda s: json.dumps({kk: s.get(kk) for kk in sorted(shared)
                                                                if kk != "optimizer"}, sort_keys=True))
        if relayout is not None and not by_settings:
            if notes is not None:  # a fused layer split (flax's query/key/value for torch's c_attn): the same model
                notes.append(relayout)
        else:
            diffs.append(_unmatched_tensors(a, b) + (f" ({relayout}, but {by_settings})" if relayout else ""))
        # the shapes both sides optimize equally often still compare: a port with an extra LayerNorm bias
        # that also stopped decaying its embeddings has two differences, and both are named
        same = {k for k in count_a if count_a[k] == count_b[k]}
        a, b = [e for e in a if e[0] in same], [e for e in b if e[0] in same]
    ca, cb = proj(a), proj(b)
    only_ref, only_run = cb - ca, ca - cb
    by_change: dict[tuple[str, str], list[str]] = {}
    for (key, sref), n in only_ref.items():
        runs = [s for (k2, s), _ in only_run.items() if k2 == key]
        srun = runs[0] if runs else "{}"
        names_ref = [t for k, _, t, s in b if k == key and json.dumps(
            {kk: s.get(kk) for kk in sorted(shared) if kk != "optimizer"}, sort_keys=True) == sref]
        names_run = [t for k, _, t, s in a if k == key and json.dumps(
            {kk: s.get(kk) for kk in sorted(shared) if kk != "optimizer"}, sort_keys=True) == srun]
        dref, drun = json.loads(sref), json.loads(srun)
        changed = [k for k in sorted(set(dref) | set(drun)) if dref.get(k) != drun.get(k)]
        what = "; ".join(f"{k} {dref.get(k)!r} -> {drun.get(k)!r}" for k in changed)
        by_change.setdefault((what, key), []).append(
            f"{', '.join(str(x) for x in names_ref[:n][:3])} (run: {', '.join(str(x) for x in names_run[:n][:3])})")
    for (what, key), tensors in list(by_change.items())[:6]:
        diffs.append(f"{what} on {len(tensors)} group(s) of tensors of shape {key}: {'; '.join(tensors[:2])}")
    clip_a, clip_b = (mine.get("clip") or {}).get("max_norm"), (theirs.get("clip") or {}).get("max_norm")
    if clip_a != clip_b:
        diffs.append(f"gradient clipping (global norm) {clip_b if clip_b is not None else 'none'} -> "
                     f"{clip_a if clip_a is not None else 'none'}")
    return diffs


CLIP_DIFF = "gradient clipping (global norm)"


def _finite_column(probe: dict[str, Any], col: int) -> list[float]:
    out = []
    for p in ((probe.get("grad_norms") or {}).get("values") or []):
        if len(p) > col and p[col] is not None:
            try:
                v = float(p[col])
            except (TypeError, ValueError):
                continue
            if math.isfinite(v):
                out.append(v)
    return out


def clipped_by_hand(run_probe: dict[str, Any], ref_probe: dict[str, Any], max_norm: float,
                    at_max_share: float) -> tuple[bool | None, str]:
    """A run whose optimizer shows no clipping where the reference clips at max_norm: does it clip by hand (a
    `g * min(1, c / ||g||)` the probe cannot see as a transformation)? Judged on the gradient norms its optimizer
    received: True when none exceeds max_norm while the reference's clip bound, and they sit at max_norm (where a
    global clip binds it leaves exactly that norm) at no less than at_max_share of the reference's share of
    binding steps; False when one exceeds it, or when they stay below it (clipped per device before the mean,
    or at a smaller norm); None when these runs cannot tell (no norms recorded, or the reference's clip never
    bound)."""
    received = _finite_column(run_probe, 1)
    if not received:
        return None, "the run recorded no gradient norms to tell"
    top = max(received)
    if top > max_norm * 1.001:
        return False, f"its optimizer received gradient norms up to {top:.4g}, above {max_norm:g}"
    pre = _finite_column(ref_probe, 3)
    bound = [v for v in pre if v > max_norm * 1.0001]
    if not bound:
        return None, (f"the {len(received)} gradient norms its optimizer received stay below {max_norm:g} (max "
                      f"{top:.4g}), and the reference's clip never bound: these runs cannot tell")
    at_max = sum(v >= max_norm * 0.999 for v in received)
    if at_max / len(received) < at_max_share * len(bound) / len(pre):
        return False, (f"the {len(received)} gradient norms its optimizer received stay below {max_norm:g} (max "
                       f"{top:.4g}), at {max_norm:g} at {at_max} steps, where the reference's clip bound at "
                       f"{len(bound)} of {len(pre)} recorded steps: a global clip leaves a norm of exactly {max_norm:g} "
                       f"where it binds, so these were made smaller some other way (clipped per device before the "
                       f"mean, or at a smaller norm)")
    return True, (f"no clipping transformation seen in the run, but the {len(received)} gradient norms its optimizer "
                  f"received never exceed {max_norm:g} (max {top:.4g}) where the reference's clip bound at "
                  f"{len(bound)} recorded steps (pre-clip up to {max(bound):.4g}): clipped by hand")


def fresh_state_steps(probe: dict[str, Any] | None) -> list[int] | None:
    """The steps after the first at which an optax optimizer received a fresh state (its floating leaves' norm
    plus its step counts, the sixth column of the JAX probe's rows, back to zero after it was not): the state was
    built anew mid-run. None when the probe did not measure it or the state holds nothing to measure."""
    rows = ((probe or {}).get("grad_norms") or {}).get("values") or []
    seen, out = False, []
    for row in rows:
        try:
            step, v = int(row[0]), float(row[5])
        except (TypeError, ValueError, IndexError):
            continue
        if v > 0:
            seen = True
        elif v == 0 and seen:
            out.append(step)
    return out if seen else None


def _max_norm(opt: dict[str, Any]) -> float | None:
    """The optimizer's global-norm clip as a number: the probe writes a non-finite one as text ("Infinity": a clip
    at max_norm=inf, used to measure the norm or to raise on a non-finite one, clips nothing)."""
    v = (opt.get("clip") or {}).get("max_norm")
    try:
        return None if v is None else float(v)
    except (TypeError, ValueError):
        return None


def _optimized_elements(opt: dict[str, Any]) -> int | None:
    """The parameter elements of the optimizer's groups; None when its tensors are not all listed."""
    total = 0
    for g in opt.get("param_groups") or []:
        ts = g.get("tensors") or []
        if len(ts) != int(g.get("n_params", len(ts))):
            return None
        for t in ts:
            if not (isinstance(t, (list, tuple)) and len(t) > 1 and isinstance(t[1], list)):
                return None
            total += math.prod(int(d) for d in t[1])
    return total


def clip_coverage(probe: dict[str, Any] | None, opt: dict[str, Any]) -> tuple[float, int, int] | None:
    """(share, elements, the optimizer's elements): the smallest share of the optimizer's parameter elements one
    call of torch's clip_grad_norm_ was given, the worst process's, or one clip of an optax optimizer takes its norm
    over (a clip inside a multi_transform branch: that branch's parameters); None when the probe did not count them
    (an older probe) or the optimizer's tensors are not all listed."""
    total = _optimized_elements(opt)
    if total is None:
        return None
    worst: tuple[float, int, int] | None = None
    counted = [opt.get("clip_coverage") or {}] if opt.get("framework") == "optax" else [
        (p.get("torch") or {}).get("clip_coverage") or {} for p in (probe or {}).get("processes") or []]
    for c in counted:
        if not c.get("calls") or c.get("min_elements") is None or total <= 0:
            continue
        n = int(c["min_elements"])
        if worst is None or n / total < worst[0]:
            worst = (n / total, n, total)
    return worst


def clip_coverage_difference(probe: dict[str, Any] | None, mine: dict[str, Any], ref_probe: dict[str, Any] | None,
                             theirs: dict[str, Any], tol: float) -> str | None:
    """A clip with the reference's max_norm that is given another share of the parameters: the clip of an
    exhausted generator (`params = model.parameters()`, consumed by the optimizer's constructor) gets no tensor,
    returns 0 and clips nothing, while its configuration reads the same."""
    a, b = clip_coverage(probe, mine), clip_coverage(ref_probe, theirs)
    if a is None or b is None or abs(a[0] - b[0]) <= tol:
        return None
    what = "no parameter (an exhausted generator, such as model.parameters() consumed by the optimizer, clips " \
           "nothing)" if a[1] == 0 else f"{a[1]:,} of its optimizer's {a[2]:,} parameter elements ({a[0]:.0%})"
    calls = int((mine.get("clip_coverage") or {}).get("calls") or 0) if mine.get("framework") == "optax" else 0
    per_branch = (f" ({calls} clips, one inside each branch of the optimizer: each takes the norm of its own "
                  "parameters, where one clip takes the norm of all of them)") if calls > 1 else ""
    return (f"{CLIP_DIFF} at the same max_norm is given {what} in its smallest call{per_branch}, where the reference's "
            f"is given {b[1]:,} of {b[2]:,} ({b[0]:.0%})")


def clip_never_bound(probe: dict[str, Any], max_norm: float) -> tuple[bool, str]:
    """Did a clip at max_norm leave every step's gradient as it was? Proven only from every step's norm: the
    torch probe's running maximum of what clip_grad_norm_ received, or norms recorded at every optimizer step
    (before clipping: torch's pre-clip column, optax's outermost gradient). A clip that never bound computed
    nothing else; one that bound once, or a run thinned to some steps, stays a difference."""
    gn = probe.get("grad_norms") or {}
    steps = int(probe.get("optimizer_steps") or 0)
    seen = gn.get("clip_seen") or {}
    if isinstance(seen.get("max_pre_clip"), (int, float)) and int(seen.get("calls") or 0) >= steps > 0:
        top, over = float(seen["max_pre_clip"]), f"the {seen['calls']} norms clip_grad_norm_ received"
    else:
        col = 3 if _finite_column(probe, 3) else (1 if "optax" in str(gn.get("source")) else None)
        values = _finite_column(probe, col) if col is not None else []
        if not values or len(values) < steps or steps < 1:
            return False, "not every step's gradient norm was recorded, so whether it bound is unknown"
        top, over = max(values), f"the gradient norms of all {len(values)} steps"
    if top + 1e-6 >= max_norm:
        return False, f"it bound: {over} reach {top:.4g}"
    return True, f"{over} stay below {max_norm:g} (max {top:.4g}): the clip never bound, so it changed nothing"


def _lr_at(values: list, steps: list[int]) -> list[float]:
    """The rate in force at each of `steps`, from a change log [[step, lr], ...] sorted by step."""
    xs = [v[0] for v in values]
    return [float(values[max(bisect.bisect_right(xs, s) - 1, 0)][1]) for s in steps]


def _rates_aligned(run: RunRecord, ref: RunRecord, run_opt: dict[str, Any], ref_opt: dict[str, Any],
                   tol: float) -> bool:
    """Whether every optimizer step both runs took ran at the same rate, step for step (no shift allowed), within
    `tol`, with the rates recorded to the end on both sides."""
    a, b = run_opt.get("lr") or {}, ref_opt.get("lr") or {}
    if not a.get("values") or not b.get("values") or a.get("stopped") or b.get("stopped"):
        return False
    n = min(int((run.probe or {}).get("optimizer_steps") or 0), int((ref.probe or {}).get("optimizer_steps") or 0))
    if n < 1:
        return False
    changes = sorted({int(v[0]) for v in a["values"]} | {int(v[0]) for v in b["values"]} | {1, n})
    steps = [s for s in changes if 1 <= s <= n]  # the rates are piecewise constant between their changes
    return all(abs(x - y) <= tol * max(abs(x), abs(y), 1e-30)
               for x, y in zip(_lr_at(sorted(a["values"]), steps), _lr_at(sorted(b["values"]), steps)))


def lr_difference(run_opt: dict[str, Any], ref_opt: dict[str, Any], run_steps: int, ref_steps: int,
                  tol: float, share: float) -> tuple[str | None, str | None]:
    """(difference, why not compared) of the learning rate each step ran at: the torch optimizer's rate as the
    program set it, or the optax step size evaluated from its number or schedule. A step counts as differing
    when neither that step nor its neighbours (a schedule stepped one call earlier or later) is within `tol`."""
    a, b = run_opt.get("lr") or {}, ref_opt.get("lr") or {}
    if not a.get("values") or not b.get("values"):
        why = a.get("stopped") or b.get("stopped") or "no learning rate was recorded (a probe older than the check)"
        return None, f"learning rate not compared ({why})"
    n = min(run_steps, ref_steps)
    for rec in (a, b):
        if rec.get("stopped") and rec["values"]:
            n = min(n, int(rec["values"][-1][0]))
    if n < 1:
        return None, "learning rate not compared (no optimizer step on one side)"
    grid = list(range(1, n + 1)) if n <= 5000 else [1 + round(i * (n - 1) / 4999) for i in range(5000)]
    va, vb = sorted(a["values"]), sorted(b["values"])
    ref = _lr_at(vb, grid)
    near = [_lr_at(va, [s + d for s in grid]) for d in (-1, 0, 1)]

    def rel(x: float, y: float) -> float:
        return abs(x - y) / max(abs(x), abs(y), 1e-30)

    # each reference step's distance to the run's rates near it, and the other way: a rate the run ran at that
    # the reference never ran at near that step (a rate set after the step it was meant for: the first update
    # at the optimizer's initial rate, 31x the warmup's first)
    runs_at = near[1]
    ref_near = [_lr_at(vb, [s + d for s in grid]) for d in (-1, 0, 1)]
    to_run = [min(rel(v[i], r) for v in near) for i, r in enumerate(ref)]
    to_ref = [min(rel(r, v[i]) for v in ref_near) for i, r in enumerate(runs_at)]
    off = [i for i, d in enumerate(to_run) if d > tol]
    # the allowance is for rates a little off at a few steps; one at twice or half the reference's is not
    far = [i for i in range(len(grid)) if max(to_run[i], to_ref[i]) > 0.5]
    if far:
        i = far[0]
        near_ref = sorted({ref_near[d][i] for d in range(3)})
        return (f"learning rate {runs_at[i]:.6g} at step {grid[i]}, where the reference ran at "
                f"{' / '.join(f'{v:.6g}' for v in near_ref)} (that step and its neighbours): {len(far)} step(s) at "
                f"more than twice or under half the reference's rate"), None
    if len(off) <= max(1, share * len(grid)):
        return None, None
    i, last = off[0], len(grid) - 1
    return (f"learning rate {ref[i]:.6g} -> {near[1][i]:.6g} at step {grid[i]} ({len(off)} of {len(grid)} steps "
            f"differ by more than {tol:.0%}; at step {grid[last]}: {ref[last]:.6g} -> {near[1][last]:.6g})"), None


def _parity_report(ctx: CheckContext):  # noqa: ANN202 - ParityReport, imported only where a parity run exists
    sides = ctx.options.get("parity")
    tol = ctx.protocol.parity.tolerances.get(sides["tolerance"]) if sides else None
    if tol is None:
        return None
    from ladder.parity.compare import compare_sides

    return compare_sides(Path(sides["reference"]), Path(sides["target"]), tol, sides["tolerance"])


def _update_verified_by_parity(ctx: CheckContext,
                               what: str = "no optimizer object in the run (an update written by hand)") -> str | None:
    """An update written by hand (no optimizer object for the probe to read, or the program's own optimizer
    class) is verified when this port's parity run passed with its parameters after K steps compared: the update
    rule, momentum, decay and clip of those steps computed the reference's numbers. None when no passing parity
    run says so."""
    report = _parity_report(ctx)
    if report is None:
        return None
    params = [r for r in report.rows if r.tensor.startswith("params/")]
    if report.problems or not report.passed or not params:
        return None
    return (f"{what}, verified at tensor level instead: "
            f"parity compared the {len(params)} parameters after its K steps with the reference's, all within "
            f"{report.tolerance} (the rate beyond those steps is not compared)")


def decay_by_hand(probe: dict[str, Any] | None, run_opt: dict[str, Any], ref_probe: dict[str, Any] | None,
                  ref_opt: dict[str, Any], ignore: list[str], tol: float) -> str | None:
    """Where the run's optimizer decays less than the reference's coupled decay by one c for every tensor: was c x
    theta added to the gradient by hand, after the clip and before the step (torch's coupled weight decay written
    out, `p.grad.add_(p, alpha=wd)` over the param groups)? Told from each recorded step's norms: the clip's norm
    N (clipped to n = min(N, max_norm)), and what the optimizer received, |g|, |theta| and <g, theta>. With
    g = g_clip + c theta, |g|^2 = n^2 + 2c <g, theta> - c^2 |theta|^2: every step must fit that within rounding,
    and the decay must show (without it |g| = n). Needs a clip on both sides over every parameter (its norm is
    the gradient's before anything was added). The note that says so, or None."""
    ref, run = tensor_settings(ref_opt, ignore), tensor_settings(run_opt, ignore)
    if len(ref) != len(run) or not ref:
        return None
    if any(s.get("weight_decay_mode") not in (None, "coupled") for *_, s in ref + run):
        return None  # decoupled decay (AdamW) is not added to the gradient
    wd_ref = {float(s.get("weight_decay") or 0.0) for *_, s in ref}
    wd_run = {float(s.get("weight_decay") or 0.0) for *_, s in run}
    if len(wd_ref) != 1 or len(wd_run) != 1:
        return None  # one decay for every tensor: the norms are global, a decay by group cannot be told
    c = next(iter(wd_ref)) - next(iter(wd_run))
    if c <= 0:
        return None
    max_norm = _max_norm(run_opt)
    if max_norm is None or max_norm != _max_norm(ref_opt) or not math.isfinite(max_norm):
        return None
    cover = [clip_coverage(pr, o) for pr, o in ((probe, run_opt), (ref_probe, ref_opt))]
    if any(cv is None or cv[0] < 0.99 for cv in cover):
        return None
    fits = shows = judged = 0
    for row in ((probe or {}).get("grad_norms") or {}).get("values") or []:
        try:
            g, th, pre, dot = (float(row[i]) for i in (1, 2, 3, 4))
        except (TypeError, ValueError, IndexError):
            continue
        if not all(math.isfinite(x) for x in (g, th, pre, dot)) or g <= 0:
            continue
        n = pre * min(1.0, float(max_norm) / (pre + 1e-6))
        judged += 1
        fits += abs(g * g - (n * n + 2 * c * dot - c * c * th * th)) <= tol * g * g
        shows += abs(g * g - n * n) > tol * g * g
    if judged < 3 or fits < judged or shows < judged / 2:
        return None
    return (f"weight decay {c:g} added to the gradient by hand after the clip (the reference's coupled decay, written "
            f"out): at all {judged} recorded steps the norm the optimizer received is the clipped gradient's plus "
            f"{c:g} x the parameters (|g|^2 = n^2 + 2c<g, theta> - c^2|theta|^2 within {tol:g}), the decay visible "
            f"at {shows}")


def decay_moved(run_opt: dict[str, Any], ref_opt: dict[str, Any], report: Any, ignore: list[str]) -> str | None:
    """Where the two optimizers' weight decay differs: did the decay move into the loss (or out of it)? Proven
    by a parity report only: every parameter after its K steps agrees, every gradient that differs is the
    reference's plus c x the initial weights (an L2 term (c/2)|w|^2; a differing loss differs by exactly that
    term), and the reference's coupled decay less each c gives, tensor for tensor (matched by shape), the decay
    the run's optimizer applies. A tensor where no term can be told (zero initial weights, a difference within
    rounding) matches any decay. A decay removed, doubled, or made decoupled fails one of these. The note that
    says so, or None."""
    if report is None or report.problems or not report.rows:
        return None
    terms = report.decay_terms
    for r in report.rows:
        if r.passed:
            continue
        if r.tensor == "loss" and report.decay_loss_agrees:
            continue
        if not (r.tensor.startswith("grads/") and r.tensor[len("grads/"):] in terms):
            return None
    if not any(r.tensor.startswith("params/") for r in report.rows) or not any(t["c"] for t in terms.values()):
        return None
    ref, run = tensor_settings(ref_opt, ignore), tensor_settings(run_opt, ignore)
    if any(s.get("weight_decay_mode") not in (None, "coupled") for *_, s in ref + run):
        return None  # decoupled decay (AdamW) is not an L2 term
    ref_by_name = {t: (k, float(s.get("weight_decay") or 0.0)) for k, _, t, s in ref}
    ref_by_key: dict[str, set[float]] = {}
    for k, _, _, s in ref:
        ref_by_key.setdefault(k, set()).add(float(s.get("weight_decay") or 0.0))
    implied: dict[str, list[float | None]] = {}
    for name, t in terms.items():
        key = shape_key(t["shape"])
        if name in ref_by_name and ref_by_name[name][0] == key:
            wd = ref_by_name[name][1]
        elif len(ref_by_key.get(key, ())) == 1:
            wd = next(iter(ref_by_key[key]))  # the tensor's name differs, but every tensor of its shape decays alike
        else:
            return None
        implied.setdefault(key, []).append(None if t["c"] is None else wd - float(t["c"]))
    actual: dict[str, list[float]] = {}
    for k, _, _, s in run:
        actual.setdefault(k, []).append(float(s.get("weight_decay") or 0.0))
    scale = max(abs(v) for vs in [*ref_by_key.values(), *actual.values()] for v in vs) if actual else 0.0
    if set(implied) != set(actual) or scale == 0:
        return None
    for key, values in implied.items():
        left = list(actual[key])
        if len(values) != len(left):
            return None
        for x in sorted((v for v in values if v is not None), key=abs):
            near = [y for y in left if abs(x - y) <= 0.02 * max(abs(x), abs(y)) + 1e-3 * scale]
            if not near:
                return None
            left.remove(near[0])
    moved = sorted({float(f"{t['c']:.3g}") for t in terms.values() if t["c"]}, key=abs)
    n = sum(1 for t in terms.values() if t["c"])
    unseen = [name for name, t in terms.items() if t["c"] is None]
    return (f"the weight decay moved between the loss and the optimizer, verified by parity: {n} gradients differ "
            f"from the reference's by exactly c x the initial weights (c = {', '.join(f'{c:.3g}' for c in moved)}), "
            f"the L2 term the other side's optimizer applies as coupled decay"
            + (", and the loss by that term" if report.decay_loss_agrees else "")
            + "; every parameter after its K steps agrees"
            + (f" ({len(unseen)} tensors where no term can be told, their initial weights zero or the difference "
               f"within rounding: {', '.join(unseen[:4])})" if unseen else ""))


def _windows_text(windows: list[list[int]]) -> str:
    parts = [f"{w[0]}-{w[-1]}" for w in windows[:4]]
    return ", ".join(parts) + (f" and {len(windows) - 4} more windows" if len(windows) > 4 else "")


def update_replayed(probe: dict[str, Any] | None, ref_opt: dict[str, Any], ignore: list[str],
                    diffs: list[str]) -> str | None:
    """Where a run's optimizer (torch's, or an optax chain) is configured otherwise than the reference's (`diffs`):
    is its update, with what the program does by hand around it (a decay added to the gradient, the parameters
    decayed outside the optax chain, a clip), the reference's? The probe samples the parameters and the gradients as
    the backward pass or `jax.grad` left them over the optimizer's first steps (torch_facts.py, jax_facts.py); the
    reference's optimizer is replayed on them (ladder.checks.replay) and must reproduce every sampled tensor's
    updates to float32 rounding with the reference's own settings. A clip difference is explained only where the
    reference's clip bound in the replayed steps. The note that says so, or None."""
    samples = (probe or {}).get("update_samples")
    if not samples or not samples.get("windows"):
        return None
    rep = replay(samples, ref_opt)
    if rep.record is None or rep.diffs or optimizer_diff(rep.record, ref_opt, ignore):
        return None
    if any(d.startswith(CLIP_DIFF) for d in diffs) and any("never bound" in n for n in rep.notes):
        return None
    m = rep.measured
    return (f"configured otherwise ({'; '.join(diffs)}), but the update is the reference's "
            f"{ref_opt.get('name')}: replayed on the run's own gradients and parameters at steps "
            f"{_windows_text(m['windows'])} (as the backward pass left them, before what the program does by hand), "
            f"{m['sampled_tensors']} tensors, worst fit {m['worst_fit_score']:g} (at most {m['fit_score_max']:g}x "
            "float32 rounding): the difference is written out by hand")


def _plain_name(name: Any) -> str | None:
    """A parameter's name without the wrappers' prefixes (DDP's module., torch.compile's _orig_mod.)."""
    if not isinstance(name, str):
        return None
    parts = [p for p in name.split(".") if p not in ("module", "_orig_mod")]
    return ".".join(parts)


def _unfrozen(opt: dict[str, Any]) -> tuple[dict[str, Any], list]:
    """An optax optimizer without its groups that `optax.set_to_zero()` freezes: those tensors are not optimized
    (the port's form of a torch buffer, such as a causal mask kept as a Flax param), so they are left out of the
    comparison, their zero gradients too. Frozen tensors that stand for ones the reference trains leave the run
    with fewer optimized tensors than the reference: still a difference. Returns (optimizer, frozen tensors)."""
    groups = opt.get("param_groups") or []
    frozen = [t for g in groups if g.get("name") == "set_to_zero" for t in g.get("tensors") or []]
    if not frozen:
        return opt, []
    out = {**opt, "param_groups": [g for g in groups if g.get("name") != "set_to_zero"]}
    out["name"] = "+".join(n for n in str(opt.get("name") or "").split("+") if n != "set_to_zero") or opt.get("name")
    ng = opt.get("no_grad")
    names = {str(t[0]) for t in frozen}
    if isinstance(ng, dict) and ng.get("params"):
        out["no_grad"] = {**ng, "params": [p for p in ng["params"] if str(p[0]) not in names]}
        # a clip over the whole chain also counts the frozen tensors' elements: those whose gradient was exactly
        # zero add nothing to its norm, so they are not counted as coverage either
        zero = sum(int(p[2]) for p in ng["params"] if str(p[0]) in names)
        cov = opt.get("clip_coverage")
        if zero and isinstance(cov, dict) and cov.get("min_elements") is not None and (
                kept := _optimized_elements(out)) is not None:
            cut = min(zero, max(0, int(cov["min_elements"]) - kept))
            out["clip_coverage"] = {**cov, "min_elements": int(cov["min_elements"]) - cut,
                                    "max_elements": int(cov.get("max_elements") or cov["min_elements"]) - cut}
    return out, frozen


def untrained_difference(run_opt: dict[str, Any], ref_opt: dict[str, Any]) -> str | None:
    """Parameters the run's optimizer holds that never had a gradient at its first steps (torch skips them: no
    update, no decay) where the reference's had one: a gradient cut (a detach, a no_grad region, a reentrant
    checkpoint whose inputs need no gradient, requires_grad turned off). By name where both sides name their
    parameters, else by shape."""
    mine, theirs = run_opt.get("no_grad"), ref_opt.get("no_grad")
    if not isinstance(mine, dict) or not isinstance(theirs, dict) or not mine.get("params"):
        return None
    if int(theirs.get("steps") or 0) < 1:
        return None  # the reference's steps were never looked at: nothing to compare with
    ref_never = theirs.get("params") or []
    # names compare within one framework (torch's "0.weight" and optax's "['w1']" name the same tensor apart)
    named = run_opt.get("framework") == ref_opt.get("framework") and all(
        _plain_name(p[0]) for p in mine["params"]) and all(
        _plain_name(t[0]) for g in ref_opt.get("param_groups") or [] for t in g.get("tensors") or [])
    if named:
        ref_names = {_plain_name(p[0]) for p in ref_never}
        extra = [p for p in mine["params"] if _plain_name(p[0]) not in ref_names]
    else:  # by shape: each of the reference's ungraded tensors excuses one of the run's of its shape
        extra, left = [], Counter(shape_key(p[1]) for p in ref_never)
        for p in mine["params"]:
            k = shape_key(p[1])
            if left[k] > 0:
                left[k] -= 1
            else:
                extra.append(p)
    if not extra:
        return None
    values = sum(int(p[2]) for p in extra)
    total = int(mine.get("values") or 0)
    share = f", {values / total:.1%} of the optimizer's {total} values" if total else ""
    listed = ", ".join(f"{p[0] or '?'} {list(p[1])}" for p in extra[:6]) + (" ..." if len(extra) > 6 else "")
    if mine.get("test") == "gradient exactly zero":  # optax: a cut gradient is zeros, and the update still runs
        return (f"{len(extra)} parameter tensor(s) ({values} values{share}) reached the optimizer with a gradient of "
                f"exactly zero at each of its first {mine.get('steps')} updates, where the reference's had one: "
                f"{listed}; nothing trains them (weight decay, where it applies, only shrinks them) (a gradient cut: "
                f"jax.lax.stop_gradient, parameters closed over as constants, a frozen subtree)")
    return (f"{len(extra)} parameter tensor(s) ({values} values{share}) reached the optimizer without a gradient at "
            f"each of its first {mine.get('steps')} steps, where the reference's had one: {listed}; the optimizer "
            f"skips them (no update, no decay), so they stay at their initial values (a gradient cut: a detach, a "
            f"no_grad region, a reentrant checkpoint whose inputs need no gradient, requires_grad off)")


def _own_class(run_opt: dict[str, Any], ref_opt: dict[str, Any]) -> str | None:
    """The run's torch optimizer class where the program defines it (outside torch and its extensions) and the
    reference's is torch's own; None otherwise."""
    mine, theirs = str(run_opt.get("class") or ""), str(ref_opt.get("class") or "")
    if run_opt.get("framework") != "torch" or not theirs.startswith("torch") or mine.startswith("torch"):
        return None
    return mine or None


@register(L, "optimizer_unchanged")
def optimizer_unchanged(ctx: CheckContext) -> CheckResult:
    name = "optimizer_unchanged"
    probe = ctx.run.probe
    if probe is None:
        return _no_probe(name)
    ref, missing = _baseline_probe(ctx, name)
    if missing:
        return missing
    ignore = ctx.protocol.l2.optimizer_ignore
    # an optimizer built again mid-run (a checkpoint resumed) is the same optimizer: one timeline each
    mine, rebuilds = timelines(probe.get("optimizers") or [], ignore)
    theirs, ref_rebuilds = timelines(ref.probe.get("optimizers") or [], ignore)
    if not theirs:
        return not_checked(L, name, "the baseline's probe saw no optimizer")
    notes: list[str] = []
    replayed: list[str] = []
    if not mine:
        verified = _update_verified_by_parity(ctx)
        if verified:
            return _result(name, True, {"class": None}, {"class": theirs[0].get("class")}, verified,
                           {"baseline": theirs[0], "verified_by": "parity"})
        rep = replay(probe.get("update_samples"), theirs[0])
        if rep.record is None:
            return not_checked(L, name, f"no optimizer observed in the run (the baseline used {theirs[0].get('class')}); "
                                        "a hand-written update is invisible to the probe unless the reference's "
                                        f"optimizer can be replayed on it ({rep.why}); a [parity] table would verify "
                                        "it at tensor level (the parameters after K steps)")
        mine = [rep.record]
        replayed = rep.diffs
        notes += [f"replayed on the run's own gradients at steps {_windows_text(rep.measured['windows'])}: "
                  f"{rep.measured['sampled_tensors']} tensors, worst fit {rep.measured['worst_fit_score']:g} "
                  f"(at most {rep.measured['fit_score_max']:g}x float32 rounding)", *rep.notes]
    mine[0], frozen = _unfrozen(mine[0])
    theirs[0], _ = _unfrozen(theirs[0])
    if frozen:
        notes.append(f"{len(frozen)} tensor(s) frozen by optax.set_to_zero() are not optimized and are compared as "
                     f"the reference's buffers are, left out: " + ", ".join(str(t[0]) for t in frozen[:4]))
    diffs = optimizer_diff(mine[0], theirs[0], ignore, notes) + replayed
    no_decay = optimizer_diff(mine[0], theirs[0], [*ignore, "weight_decay"])  # the differences but weight decay's
    clip_ref = _max_norm(theirs[0])
    if diffs and ctx.options.get("parity"):  # a weight-decay difference parity shows moved into the loss
        decay_only = [d for d in diffs if d not in no_decay]
        moved = decay_moved(mine[0], theirs[0], _parity_report(ctx), ignore) if decay_only else None
        if moved:
            diffs = [d for d in diffs if d not in decay_only] + [d for d in no_decay if d not in diffs]
            notes.append(moved)
    if diffs:  # a weight-decay difference the gradient norms show added to the gradient by hand
        decay_only = [d for d in diffs if d not in no_decay]
        by_hand = (decay_by_hand(probe, mine[0], ref.probe, theirs[0], ignore, ctx.protocol.l2.decay_fit_tol)
                   if decay_only else None)
        if by_hand:
            diffs = [d for d in diffs if d not in decay_only] + [d for d in no_decay if d not in diffs]
            notes.append(by_hand)
    clip_run = _max_norm(mine[0])
    if clip_ref is not None and clip_run is None:
        by_hand, why = clipped_by_hand(probe, ref.probe, float(clip_ref), ctx.protocol.l2.clip_at_max_share)
        if not by_hand:
            idle, why_idle = clip_never_bound(ref.probe, float(clip_ref))
            by_hand, why = (True, f"the reference's clip: {why_idle}") if idle else (by_hand, why)
        if by_hand:  # the clip is there, written by hand, or the reference's never acted: not a difference
            diffs = [d for d in diffs if not d.startswith(CLIP_DIFF)]
            notes.append(why)
        else:
            diffs = [f"{d} ({why})" if d.startswith(CLIP_DIFF) else d for d in diffs]
    elif clip_run is not None and clip_ref is None:
        idle, why = clip_never_bound(probe, float(clip_run))
        if idle:  # a clip added that never acted in this run: noted, not a difference
            diffs = [d for d in diffs if not d.startswith(CLIP_DIFF)]
            notes.append(f"clipping at {clip_run:g} added: {why}")
        else:
            diffs = [f"{d} ({why})" if d.startswith(CLIP_DIFF) else d for d in diffs]
    elif clip_run is not None and clip_run == clip_ref:
        covered = clip_coverage_difference(probe, mine[0], ref.probe, theirs[0], ctx.protocol.l2.clip_coverage_tol)
        if covered:
            diffs.append(covered)
    # an optax chain's other differences are structural (a step size before the momentum is torch's SGD only at a
    # constant rate): its replay explains a weight decay written out beside it, nothing else
    decay_alone = mine[0].get("framework") == "optax" and not no_decay
    if diffs and (mine[0].get("framework") == "torch" or decay_alone):
        explained = update_replayed(probe, theirs[0], ignore, diffs)
        if explained:
            notes.append(explained)
            diffs = []
    lr_diff, lr_why = lr_difference(mine[0], theirs[0], int(probe.get("optimizer_steps") or 0),
                                    int(ref.probe.get("optimizer_steps") or 0), ctx.protocol.l2.lr_rel_tol,
                                    ctx.protocol.l2.lr_steps_share)
    if lr_diff:
        diffs.append(lr_diff)
    elif lr_why:
        notes.append(lr_why)
    for why in (stale_gradients(ctx.run, ref, ctx.protocol.l2.stale_grad_steps_share),
                schedule_stepped_first(ctx.run, ref, mine[0], theirs[0], ctx.protocol.l2.lr_rel_tol),
                untrained_difference(mine[0], theirs[0])):
        if why:
            diffs.append(why)
    restarted = [r for r in rebuilds if r["state_restarted"]]
    fresh = fresh_state_steps(probe) or []
    if len(restarted) + len(fresh) > sum(1 for r in ref_rebuilds if r["state_restarted"]) + len(
            fresh_state_steps(ref.probe) or []):
        if restarted:
            r = restarted[0]
            diffs.append(f"the optimizer was built again at step {r['step']} without its state: it held state before "
                         f"and none at its first step after (momentum or Adam's moments and step count restarted "
                         f"from zero; a checkpoint restored without the optimizer's state)")
        else:
            diffs.append(f"the optimizer's state was a fresh one again at step {fresh[0]}: its moments and step "
                         f"counts all zero, as at the first update, where it held state before (the state restarted "
                         f"from zero; a checkpoint restored without the optimizer's state, or the state built anew)")
    elif rebuilds:
        notes.append(f"the optimizer was built again at step(s) {', '.join(str(r['step']) for r in rebuilds[:4])} "
                     "(a checkpoint resumed) and is judged as one timeline"
                     + ("" if any(r["state_restarted"] is None for r in rebuilds) else
                        ", its state loaded each time"))
    changed = [c for c in mine[0].get("changes") or []]
    if changed and not (theirs[0].get("changes") or []):
        diffs.append(f"hyperparameters changed during the run at step {changed[0]['step']} (not in the baseline)")
    if len(mine) != len(theirs):
        diffs.append(f"{len(theirs)} optimizer(s) in the baseline, {len(mine)} in the run")
    measured = {"class": mine[0].get("class"), "groups": len(mine[0].get("param_groups") or []),
                "clip": mine[0].get("clip")}
    threshold = {"class": theirs[0].get("class"), "groups": len(theirs[0].get("param_groups") or []),
                 "clip": theirs[0].get("clip"), "ignore": ignore}
    details = {"run": mine[0], "baseline": theirs[0], "diff": diffs, "clip_by_hand": notes or None}
    own = _own_class(mine[0], theirs[0])
    if own and diffs and all(d.startswith("optimizer ") for d in diffs):
        # the program's own Optimizer subclass with the reference's settings: what its step computes is its code's
        what = (f"the run's optimizer is the program's own class {own} (an update written by hand) with the "
                f"reference's settings for every tensor")
        verified = _update_verified_by_parity(ctx, what)
        if verified:
            return _result(name, True, measured, threshold, verified, {**details, "verified_by": "parity"})
        return not_checked(L, name, f"{what}; whether its step computes {theirs[0].get('name')}'s update is not "
                                    "read by the probe: a [parity] table verifies it at tensor level (the parameters "
                                    "after K steps)")
    if diffs:
        return _result(name, False, measured, threshold, "the optimisation changed: " + "; ".join(diffs), details)
    return _result(name, True, measured, threshold,
                   f"{mine[0].get('class')}: every parameter tensor has the reference's hyperparameters, weight decay "
                   f"and clipping (ignoring {', '.join(ignore)})"
                   + ("" if lr_why else ", and each step's learning rate")
                   + "".join(f"; {n}" for n in notes), details)
