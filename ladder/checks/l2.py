"""L2: the run really computed on the target device, the same way as the baseline.

Each check reads the merged probe report (`RunRecord.probe`, see ladder.runs.probe_report), the parsed
log and, where it compares, the baseline's short run; thresholds come only from `protocol.l2`.
A run without a probe report gives `not_checked` (numerics still fails on a non-finite loss in
the log, and evaluation_complete needs only the logs).

Expected platforms and the probe facts that meet them:
  cpu      torch tensors seen in forward calls are all on `cpu`
  cuda     ... all on `cuda`
  xla      ... all on `xla`, whatever PJRT device backs it (PJRT_DEVICE=CPU is fine), and XLA
           executed at least one graph
  tpu      as xla, and torch_xla's runtime device type is TPU
  jax-cpu / jax-gpu / jax-tpu   jax.default_backend() is cpu / gpu (cuda, rocm) / tpu
"""

from __future__ import annotations

import math
from typing import Any

from ladder.checks import CheckContext, not_checked, register
from ladder.runs.probe_report import classify_aten
from ladder.runs.records import RunRecord
from ladder.checks.results import CheckResult

L = "L2"
_JAX_GPU = {"gpu", "cuda", "rocm"}


def _result(name: str, ok: bool, measured: Any, threshold: Any, evidence: str,
            details: dict[str, Any] | None = None) -> CheckResult:
    return CheckResult(level=L, name=name, status="passed" if ok else "failed", measured=measured,
                       threshold=threshold, evidence=evidence, details=details or {})


def _no_probe(name: str) -> CheckResult:
    return not_checked(L, name, "no probe report for this run (was it captured with the probe injected?)")


def total_steps(run: RunRecord) -> int:
    probe_steps = (run.probe or {}).get("optimizer_steps", 0)
    log_steps = run.loss_curve[-1].step if run.loss_curve else 0
    return max(probe_steps, log_steps, 0)


def warmup_end(ctx: CheckContext, steps: int) -> int:
    r = ctx.protocol.l2
    return max(r.warmup_steps, math.ceil(r.warmup_fraction * steps))


def step_from_log(run: RunRecord, t_epoch: float) -> int | None:
    """The last logged training step at or before an epoch time. Not interpolated: a burst of
    compilations takes time itself, and interpolating would spread one burst (the first evaluation)
    over several "steps". Before the first logged line: 0 (set-up and warm-up); after the last: None."""
    pts = [(p.step, run.started_at + p.t) for p in run.loss_curve]
    if not pts or t_epoch <= pts[0][1]:
        return 0 if pts else None
    for (s0, _), (_, t1) in zip(pts, pts[1:]):
        if t_epoch <= t1:
            return s0
    return None


# ---------------------------------------------------------------- platform

def _observed(probe: dict[str, Any]) -> dict[str, list[str]]:
    p = probe.get("platforms") or {}
    return {"torch": list(p.get("torch") or []), "xla": list(p.get("xla") or []), "jax": list(p.get("jax") or [])}


@register(L, "platform")
def platform(ctx: CheckContext) -> CheckResult:
    name = "platform"
    probe = ctx.run.probe
    if probe is None:
        return _no_probe(name)
    exp = ctx.expected_platform
    seen = _observed(probe)
    torch_set, jax_set = set(seen["torch"]), set(seen["jax"])
    first = (probe.get("torch_devices") or {}).get("first_seen") or {}

    def where(dev: str) -> str:
        f = first.get(dev)
        return "" if not f else f" (first: {f.get('module')} {f.get('what')}s at +{f['t'] - ctx.run.started_at:.1f}s)"

    if exp in ("cpu", "cuda", "xla", "tpu"):
        want = "xla" if exp == "tpu" else exp
        if not torch_set:
            return CheckResult(level=L, name=name, status="undecided", threshold=exp, measured=seen,
                               evidence="no torch module forward call was observed, so tensor devices are unknown")
        wrong = sorted(torch_set - {want})
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
        return _result(name, True, seen, exp, f"all sampled parameters and inputs on {want}{backing}")
    if exp.startswith("jax-"):
        want = exp[4:]
        if not jax_set:
            return CheckResult(level=L, name=name, status="undecided", threshold=exp, measured=seen,
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
    if "torch_xla" not in (probe.get("frameworks") or {}):
        return _result(name, True, {}, r.fallback_allow,
                       "no PyTorch/XLA in the run: no aten:: fallback mechanism to count "
                       "(a JAX or eager-torch run that left the device fails the platform check)")
    cls = classify_aten(probe.get("aten_counters") or {}, r.fallback_allow, r.host_sync_ops)
    steps = max(total_steps(ctx.run), 1)
    bad = cls["fallback"]
    if bad:
        ops = ", ".join(f"{k} x{v} ({v / steps:.2f}/step)" for k, v in sorted(bad.items(), key=lambda kv: -kv[1]))
        return _result(name, False, bad, r.fallback_allow, f"CPU fallback ops over {steps} steps: {ops}", cls)
    return _result(name, True, {}, r.fallback_allow, "no unexpected aten:: counters"
                   + (f" (allowed: {cls['allowed']})" if cls["allowed"] else ""), cls)


# ---------------------------------------------------------------- recompilation

def _events_with_steps(run: RunRecord) -> list[dict[str, Any]]:
    out = []
    for e in (run.probe or {}).get("compile_events") or []:
        step = e.get("step")
        # JAX has no optimizer hook: map through the log's times. A compile after the last logged
        # step (a final evaluation) is placed after training.
        if step is None:
            step = step_from_log(run, e["t"])
            if step is None:
                step = total_steps(run) + 1
        out.append({**e, "step": step})
    return out


@register(L, "recompilation")
def recompilation(ctx: CheckContext) -> CheckResult:
    """Dynamo says when it recompiles. JAX and PyTorch/XLA only say that they compiled: a new graph
    after warm-up (the first evaluation, the last step) is normal, so compilation counts as not having
    stopped when compiles after warm-up happen at more distinct steps than the protocol allows
    ([l2].max_compile_steps_after_warmup). JAX names the function, which the evidence reports."""
    name = "recompilation"
    probe = ctx.run.probe
    if probe is None:
        return _no_probe(name)
    steps = total_steps(ctx.run)
    w = warmup_end(ctx, steps)
    limit = ctx.protocol.l2.max_compile_steps_after_warmup
    events = _events_with_steps(ctx.run)
    threshold = {"warmup_end_step": w, "max_compile_steps_after_warmup": limit}
    late = [e for e in events if e["step"] > w]
    problems: list[str] = []
    gave_up = [e for e in events if e["source"] == "dynamo" and e["kind"] == "recompile_limit"]
    if gave_up:  # whenever it happens: from then on the function runs uncompiled
        e = gave_up[0]
        problems.append(f"torch.compile gave up on {e['function']} at step {e['step']}: {e['cause']} "
                        "(it recompiled on every call until the limit, then ran eagerly)")
    dyn = [e for e in late if e["source"] == "dynamo" and e["kind"] == "recompile"]
    if dyn:
        e = dyn[0]
        problems.append(f"torch.compile recompiled {len(dyn)}x after warm-up; first: {e['function']} at step "
                        f"{e['step']}, guard failure: {e['cause']}")
    for source, label in (("jax", "JAX"), ("xla", "PyTorch/XLA")):
        compiles = [e for e in late if e["source"] == source and e["kind"] == "compile"]
        at = sorted({e["step"] for e in compiles})
        if len(at) <= limit:
            continue
        text = (f"{label} compiled {len(compiles)}x after warm-up at {len(at)} different steps "
                f"({', '.join(map(str, at[:10]))}{'...' if len(at) > 10 else ''}; at most {limit} allowed): "
                f"compilation did not stop, e.g. shapes or static values change per step")
        fns = [e["function"] for e in compiles if e.get("function")]
        if fns:
            top = max(set(fns), key=fns.count)
            text += f"; most compiled: {top} ({fns.count(top)}x)"
        problems.append(text)
    details = {"warmup_end_step": w, "steps": steps, "compiles": probe.get("compiles"),
               "after_warmup": [{k: e.get(k) for k in ("source", "kind", "step", "function", "cause")}
                                for e in late[:50]]}
    measured = {"after_warmup": len([e for e in late if e["kind"] != "graph_break"])}
    if problems:
        return _result(name, False, measured, threshold, "; ".join(problems), details)
    n_breaks = probe.get("compiles", {}).get("dynamo_graph_breaks", 0)
    note = f"; {n_breaks} torch.compile graph breaks" if n_breaks else ""
    return _result(name, True, measured, threshold,
                   f"no recompilation after warm-up (step {w}); {len(late)} new graph(s) after it{note}", details)


# ---------------------------------------------------------------- host syncs

def _syncs_per_step(run: RunRecord) -> tuple[float, str] | None:
    """Transfers from device per step, and what they were; None when the run has no device counter."""
    probe = run.probe or {}
    fw = probe.get("frameworks") or {}
    host = probe.get("host_transfers") or {}
    steps = max(total_steps(run), 1)
    if "torch_xla" in fw:
        n = host.get("transfer_from_device", 0)
        return n / steps, (f"{n} PyTorch/XLA transfers from device over {steps} steps, "
                           f"{host.get('host_sync_ops', 0)} of them .item()/.tolist() (aten::_local_scalar_dense)")
    if "jax" in fw and host.get("jax_host_reads") is not None and (probe.get("platforms") or {}).get("jax"):
        n = host.get("jax_host_reads", 0)
        return n / steps, f"{n} jax.Array reads to host (float(), np.asarray, print) over {steps} steps"
    return None


@register(L, "host_syncs")
def host_syncs(ctx: CheckContext) -> CheckResult:
    name = "host_syncs"
    probe = ctx.run.probe
    if probe is None:
        return _no_probe(name)
    r = ctx.protocol.l2
    mine = _syncs_per_step(ctx.run)
    if mine is None:
        if set((probe.get("platforms") or {}).get("torch") or []) == {"cpu"}:
            return _result(name, True, 0.0, None, "the run computed on the host: there is no device to sync with")
        return not_checked(L, name, "the probe counts host transfers only for PyTorch/XLA and JAX")
    ref = ctx.reference()
    base = _syncs_per_step(ref) if ref is not None and ref.probe is not None else None
    if base is not None:
        bound, why = r.host_sync_slack * base[0], f"{r.host_sync_slack}x the baseline's {base[0]:.3f}/step"
    else:
        bound, why = r.max_host_syncs_per_step, "protocol bound (the baseline has no device counters)"
    per, what = mine
    ok = per <= bound
    return _result(name, ok, round(per, 4), round(bound, 4),
                   f"{per:.3f} transfers from device per step ({what}) {'<=' if ok else '>'} {bound:.3f}, {why}")


# ---------------------------------------------------------------- numerics

@register(L, "numerics")
def numerics(ctx: CheckContext) -> CheckResult:
    name = "numerics"
    run = ctx.run
    bad_loss = list(run.nonfinite_losses) + [p for p in run.loss_curve if not math.isfinite(p.loss)]
    bad_params = (run.probe or {}).get("nonfinite_params") or []
    problems = []
    if bad_loss:
        first = min(bad_loss, key=lambda p: p.step)
        problems.append(f"non-finite loss ({first.loss}) first at step {first.step}, {len(bad_loss)} logged")
    if bad_params:
        problems.append(f"non-finite parameters at exit: {', '.join(bad_params[:5])}")
    if problems:
        return _result(name, False, {"nonfinite_losses": len(bad_loss), "nonfinite_params": len(bad_params)},
                       0, "; ".join(problems))
    if run.probe is None:
        return _no_probe(name)
    checked = "losses and parameters" if (run.probe.get("nonfinite_params") is not None and
                                          any((p.get("options") or {}).get("param_nonfinite")
                                              for p in run.probe.get("processes", []))) else "losses"
    return _result(name, True, 0, 0, f"all {run.loss_lines or len(run.loss_curve)} logged {checked} finite")


# ---------------------------------------------------------------- evaluation complete

@register(L, "evaluation_complete")
def evaluation_complete(ctx: CheckContext) -> CheckResult:
    name = "evaluation_complete"
    ref = ctx.reference()
    if ref is None:
        return not_checked(L, name, "no baseline short run to compare the evaluations with")
    mine, theirs = ctx.run.evals, ref.evals
    measured = {"events": len(mine), "items": [e.items for e in mine]}
    threshold = {"events": len(theirs), "items": [e.items for e in theirs]}
    if len(mine) != len(theirs):
        return _result(name, False, measured, threshold,
                       f"{len(mine)} evaluation events, the baseline logged {len(theirs)}")
    if ctx.protocol.l2.eval_items_must_match:
        for i, (a, b) in enumerate(zip(mine, theirs)):
            if a.items is not None and b.items is not None and a.items != b.items:
                return _result(name, False, measured, threshold,
                               f"evaluation {i + 1} (step {a.step}) covered {a.items} items, the baseline's {b.items}")
    return _result(name, True, measured, threshold, f"{len(mine)} evaluation events, items as in the baseline")


# ---------------------------------------------------------------- optimizer unchanged

_KEY_ALIASES = {"learning_rate": "lr"}


def normalise_optimizer(o: dict[str, Any]) -> dict[str, Any]:
    """A framework-neutral view: lower-case name, torch key names, neutral values (0, False, None) as None,
    so torch's SGD(momentum=0) and optax.sgd(momentum=None) compare equal."""
    groups = []
    for g in o.get("param_groups") or []:
        h: dict[str, Any] = {}
        for k, v in g.items():
            h[_KEY_ALIASES.get(k, k)] = v
        if "b1" in h and "b2" in h:
            h["betas"] = [h.pop("b1"), h.pop("b2")]
        groups.append({k: (None if v in (0, 0.0, False, None) and not isinstance(v, list) else v)
                       for k, v in h.items()})
    return {"name": str(o.get("name", "?")).lower(), "framework": o.get("framework"), "groups": groups}


def optimizer_diff(mine: dict[str, Any], theirs: dict[str, Any], ignore: list[str]) -> list[str]:
    a, b = normalise_optimizer(mine), normalise_optimizer(theirs)
    diffs = []
    if a["name"] != b["name"]:
        diffs.append(f"optimizer {b['name']} -> {a['name']}")
    same_framework = a["framework"] == b["framework"]
    if same_framework and len(a["groups"]) != len(b["groups"]):
        diffs.append(f"param groups {len(b['groups'])} -> {len(a['groups'])}")
    for i, (ga, gb) in enumerate(zip(a["groups"], b["groups"])):
        # Across frameworks only shared hyperparameters compare: torch's implementation flags
        # (foreach, fused, decoupled_weight_decay, ...) have no optax counterpart, and what they imply
        # is already in the optimizer's name (adamw vs adam).
        keys = set(ga) | set(gb) if same_framework else set(ga) & set(gb)
        for k in sorted(keys):
            if k in ignore:
                continue
            va, vb = ga.get(k), gb.get(k)
            if va != vb:
                diffs.append(f"group {i} {k}: {vb!r} -> {va!r}")
    return diffs


@register(L, "optimizer_unchanged")
def optimizer_unchanged(ctx: CheckContext) -> CheckResult:
    name = "optimizer_unchanged"
    probe = ctx.run.probe
    if probe is None:
        return _no_probe(name)
    ref = ctx.reference()
    if ref is None or ref.probe is None:
        return not_checked(L, name, "no baseline probe report to compare the optimizer with")
    mine, theirs = probe.get("optimizers") or [], ref.probe.get("optimizers") or []
    if not theirs:
        return not_checked(L, name, "the baseline's probe saw no optimizer")
    if not mine:
        return CheckResult(level=L, name=name, status="undecided", threshold=theirs[0].get("class"),
                           evidence=f"no optimizer observed in the run (the baseline used {theirs[0].get('class')}); "
                                    "a hand-written update is invisible to the probe")
    ignore = ctx.protocol.l2.optimizer_ignore
    diffs = optimizer_diff(mine[0], theirs[0], ignore)
    changed = [c for c in mine[0].get("changes") or []]
    if changed and not (theirs[0].get("changes") or []):
        diffs.append(f"hyperparameters changed during the run at step {changed[0]['step']} (not in the baseline)")
    if len(mine) != len(theirs):
        diffs.append(f"{len(theirs)} optimizer(s) in the baseline, {len(mine)} in the run")
    measured = {"class": mine[0].get("class"), "param_groups": mine[0].get("param_groups")}
    threshold = {"class": theirs[0].get("class"), "param_groups": theirs[0].get("param_groups"), "ignore": ignore}
    if diffs:
        return _result(name, False, measured, threshold, "; ".join(diffs), {"diff": diffs})
    return _result(name, True, measured, threshold,
                   f"{mine[0].get('class')} with the baseline's hyperparameters (ignoring {', '.join(ignore)})")
