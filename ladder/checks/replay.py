"""The reference's optimizer replayed on a hand-written update's own gradients.

A JAX port that writes its update by hand (no optax) shows the probe no optimizer. The probe samples instead,
for a few windows of consecutive training steps, the first elements of each parameter and gradient leaf the
step's `jax.grad` saw, and the gradient's global norm (`update_samples`). Consecutive steps give each update
(the next step's parameters minus this step's). The torch probe samples the same way over a torch optimizer's
first steps, after each backward pass (before what the program does by hand ahead of optimizer.step), so that
an optimizer configured otherwise whose update is the reference's can be told (`ladder.checks.l2.update_replayed`).
This module replays the reference's torch optimizer (SGD or
Adam/AdamW, per parameter group, with its clip and its learning rate at each step) on those gradients and
parameters, in float64, and compares:

- the first window starts at the first step, with the optimizer's state empty: the whole rule is replayed;
- a later window of an SGD rule infers the momentum buffer from the window's first update, so that the
  learning rate of each later step is checked too (an Adam state cannot be inferred; not compared).

Each parameter leaf is given the reference group whose rule reproduces its updates to float32 rounding. A
leaf no group reproduces is explained, where one explanation does, by one setting changed (no weight decay,
no momentum, decay coupled or decoupled, no clipping) or by a scaled step size; its settings are then the
changed ones. The result is an optimizer record in the reference's own terms, compared by `optimizer_diff`
like any other.
"""

from __future__ import annotations

import bisect
import math
from dataclasses import dataclass, field
from typing import Any

import numpy as np

# A leaf fits a rule when the residual of its replayed updates is within this many times the float32 rounding
# of the stored parameters plus the update's own float32 arithmetic: 1e-6 of the update, and for Adam the
# bias correction 1 - b2**t a port may compute in float32 (b2 = 0.999 is stored as 0.99900001, so 1 - b2 is
# off by 2**-23 / (1 - b2) relative: 1.2e-4 for 0.999).
FIT_SCORE = 8.0
_REL = 1e-6
_TORCH_RULES = {"sgd": "sgd", "adam": "adam", "adamw": "adam"}


@dataclass
class Replay:
    record: dict[str, Any] | None  # an optimizer record in the reference's terms, or None when not replayed
    diffs: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    why: str | None = None  # why not replayed
    measured: dict[str, Any] = field(default_factory=dict)


def _rule(group: dict[str, Any], kind: str, base_lr: float, name: str) -> dict[str, Any]:
    lr0 = float(group.get("initial_lr", group.get("lr")) or 0.0)
    wd = float(group.get("weight_decay") or 0.0)
    decoupled = bool(name == "adamw" or group.get("decoupled_weight_decay"))
    betas = group.get("betas") or [0.9, 0.999]
    return {"kind": kind, "momentum": float(group.get("momentum") or 0.0),
            "dampening": float(group.get("dampening") or 0.0), "nesterov": bool(group.get("nesterov")),
            "weight_decay": wd, "decoupled": decoupled, "betas": [float(betas[0]), float(betas[1])],
            "eps": float(group.get("eps") or 1e-8), "lr_ratio": lr0 / base_lr if base_lr else 1.0, "clip": True}


def _variants(rule: dict[str, Any], clip: float | None) -> list[tuple[str, dict[str, Any]]]:
    """One setting changed at a time: the explanations tried for a leaf no reference group reproduces."""
    out = []
    if rule["weight_decay"]:
        out.append(("weight_decay", {**rule, "weight_decay": 0.0}))
        out.append(("weight_decay_mode", {**rule, "decoupled": not rule["decoupled"]}))
    if rule["kind"] == "sgd" and rule["momentum"]:
        out.append(("momentum", {**rule, "momentum": 0.0, "nesterov": False}))
        out.append(("nesterov", {**rule, "nesterov": not rule["nesterov"]}))
    if clip is not None:
        out.append(("clip", {**rule, "clip": False}))
    return out


def _lr_at(values: list, step: int) -> float:
    xs = [v[0] for v in values]
    return float(values[max(bisect.bisect_right(xs, step) - 1, 0)][1])


def _window_arrays(w: dict[str, Any], leaf: int) -> tuple[np.ndarray, np.ndarray]:
    grads = w["grads"]
    return (np.array([step[leaf] for step in w["params"]], dtype=np.float64),
            np.array([step[leaf] for step in grads], dtype=np.float64))


def _predict(rule: dict[str, Any], p: np.ndarray, g: np.ndarray, lrs: list[float], coefs: list[float],
             first: bool) -> tuple[np.ndarray, np.ndarray, int]:
    """(predicted updates, actual updates, the first update predicted) of one leaf over one window. `first`:
    the window starts at the first optimizer step (the state is empty)."""
    actual = p[1:] - p[:-1]
    n = len(actual)
    pred = np.zeros_like(actual)
    wd, mom = rule["weight_decay"], rule["momentum"]
    if rule["kind"] == "sgd":
        buf = None
        start = 0 if first or not mom else 1
        if start:  # the buffer before the window's second update, from its first
            buf = -actual[0] / lrs[0] if lrs[0] else np.zeros_like(actual[0])
        for k in range(start, n):
            d = g[k] * (coefs[k] if rule["clip"] else 1.0)
            if wd and not rule["decoupled"]:
                d = d + wd * p[k]
            if mom:
                buf = d if buf is None else mom * buf + (1.0 - rule["dampening"]) * d
                step = d + mom * buf if rule["nesterov"] else buf
            else:
                step = d
            pred[k] = -lrs[k] * step - (lrs[k] * wd * p[k] if wd and rule["decoupled"] else 0.0)
        return pred[start:], actual[start:], start
    b1, b2 = rule["betas"]
    m = np.zeros_like(p[0])
    v = np.zeros_like(p[0])
    for k in range(n):
        gk = g[k] * (coefs[k] if rule["clip"] else 1.0)
        if wd and not rule["decoupled"]:
            gk = gk + wd * p[k]
        m = b1 * m + (1 - b1) * gk
        v = b2 * v + (1 - b2) * gk * gk
        t = k + 1
        denom = np.sqrt(v) / math.sqrt(1 - b2 ** t) + rule["eps"]
        pred[k] = -lrs[k] / (1 - b1 ** t) * m / denom - (lrs[k] * wd * p[k] if wd and rule["decoupled"] else 0.0)
    return pred, actual, 0


def _rel(rule: dict[str, Any]) -> float:
    return _REL + (2.0 ** -23 / max(1.0 - rule["betas"][1], 1e-12) if rule["kind"] == "adam" else 0.0)


def _score(pred: np.ndarray, actual: np.ndarray, p_next: np.ndarray, rel: float = _REL) -> float:
    """The residual in units of float32 rounding: the stored parameters' spacing plus `rel` of the update."""
    allowance = np.linalg.norm(np.spacing(np.abs(p_next).astype(np.float32)).astype(np.float64)) \
        + rel * np.linalg.norm(actual)
    r = np.linalg.norm(pred - actual)
    return float(r / allowance) if allowance > 0 else (0.0 if r == 0 else math.inf)


def _relative(pred: np.ndarray, actual: np.ndarray) -> float:
    scale = max(np.linalg.norm(actual), np.linalg.norm(pred))
    return float(np.linalg.norm(pred - actual) / scale) if scale else 0.0


def _fit(rule: dict[str, Any], w: dict[str, Any], leaf: int, shifted: list[list[float]], coefs: list[float],
         first: bool) -> tuple[float, float, np.ndarray, np.ndarray]:
    """(score, relative error, predicted, actual) of one leaf's updates in one window, with the best of the
    shifted rate lists."""
    p, g = _window_arrays(w, leaf)
    if rule["kind"] == "adam" and not first:
        return math.nan, math.nan, np.zeros(0), np.zeros(0)
    best = None
    for lrs in shifted:
        pred, actual, start = _predict(rule, p, g, [lr * rule["lr_ratio"] for lr in lrs], coefs, first)
        score = _score(pred, actual, p[1 + start:], _rel(rule))
        if best is None or score < best[0]:
            best = (score, _relative(pred, actual), pred, actual)
    return best


def _group_settings(group: dict[str, Any], rule: dict[str, Any], variant: str | None) -> dict[str, Any]:
    """The reference group's settings, with the one a variant changed, in torch's words."""
    s = {k: v for k, v in group.items() if k not in ("tensors", "n_params", "params")}
    if variant == "weight_decay":
        s["weight_decay"] = 0.0
    elif variant == "weight_decay_mode":
        s["decoupled_weight_decay"] = not rule["decoupled"]
    elif variant == "momentum":
        s["momentum"], s["nesterov"] = 0.0, False
    elif variant == "nesterov":
        s["nesterov"] = not rule["nesterov"]
    return s


def replay(samples: dict[str, Any] | None, ref_opt: dict[str, Any]) -> Replay:
    """Replay `ref_opt` (a torch optimizer record of the reference) on a hand-written update's samples. A
    schedule stepped one call earlier or later is no difference (as the rate comparison of a recorded
    optimizer allows): each window is replayed with the reference's rates of the step before, of the step, and
    of the step after, and the best fit counts."""
    if not samples or not samples.get("windows"):
        why = (samples or {}).get("why") or ("the probe samples a JAX step jitted with exactly one jax.grad of its "
                                             "parameter arguments, and saw none")
        return Replay(None, why=why)
    name = str(ref_opt.get("name") or "").lower()
    kind = _TORCH_RULES.get(name)
    if ref_opt.get("framework") != "torch" or kind is None:
        return Replay(None, why=f"replaying the reference's {ref_opt.get('class')} is not supported (torch SGD, "
                                "Adam and AdamW are)")
    groups = ref_opt.get("param_groups") or []
    lr_rec = ref_opt.get("lr") or {}
    main = groups[int(lr_rec.get("group") or 0)] if groups else {}
    base_lr = float(main.get("initial_lr", main.get("lr")) or 0.0)
    values = lr_rec.get("values") or [[1, base_lr]]
    clip = (ref_opt.get("clip") or {}).get("max_norm")
    clip = None if clip is None else float(clip)  # run.json keeps a non-finite one as text ("Infinity")
    rules = [_rule(g, kind, base_lr, name) for g in groups]
    windows = [w for w in samples["windows"] if len(w.get("steps") or []) >= 2
               and w["steps"] == list(range(w["steps"][0], w["steps"][0] + len(w["steps"])))]
    first = next((w for w in windows if w["steps"][0] == 1), None)
    if first is None:
        return Replay(None, why="the sampled steps do not include the first update")
    paths, shapes = samples["paths"], samples["shapes"]
    sampled = len(first["params"][0])

    def rates(w: dict[str, Any]) -> list[list[float]]:  # the rates of the window's steps, shifted by -1, 0, +1
        return [[_lr_at(values, s + d) for s in w["steps"][:-1]] for d in (0, -1, 1)]

    def clip_coefs(w: dict[str, Any]) -> list[float]:
        return [min(1.0, float(clip) / (n + 1e-6)) if clip is not None and n == n else 1.0 for n in w["gnorm"][:-1]]

    shifted, coefs = rates(first), clip_coefs(first)
    clip_bound = clip is not None and min(coefs) < 1.0
    result = Replay(None)
    assigned: list[tuple[int, str | None]] = []
    unexplained: list[str] = []
    worst = 0.0
    for leaf in range(sampled):
        fits = [(_fit(r, first, leaf, shifted, coefs, True)[:2], gi) for gi, r in enumerate(rules)]
        (score, rel), gi = min(fits, key=lambda f: f[0][0])
        if score <= FIT_SCORE:
            assigned.append((gi, None))
            worst = max(worst, score)
            continue
        tried = [(_fit(r2, first, leaf, shifted, coefs, True)[:2], key, gj, r2) for gj, r in enumerate(rules)
                 for key, r2 in _variants(r, clip)]
        good = [t for t in tried if t[0][0] <= FIT_SCORE]
        if good:
            (_, _), key, gj, _ = min(good, key=lambda t: t[0][0])
            assigned.append((gj, key))  # the changed setting is the record's: optimizer_diff names it
            continue
        _, _, pred, actual = _fit(rules[gi], first, leaf, shifted[:1], coefs, True)
        alpha = float(np.dot(pred.ravel(), actual.ravel()) / max(np.dot(pred.ravel(), pred.ravel()), 1e-300))
        if alpha > 0 and _score(alpha * pred, actual, _window_arrays(first, leaf)[0][1:], _rel(rules[gi])) <= FIT_SCORE:
            assigned.append((gi, None))
            result.diffs.append(f"step size x{alpha:.4g} on {paths[leaf]} {tuple(shapes[leaf])} (the reference's "
                                f"{shifted[0][0] * rules[gi]['lr_ratio']:.6g} at step 1)")
            continue
        assigned.append((gi, None))
        unexplained.append(f"{paths[leaf]} {tuple(shapes[leaf])} (relative error {rel:.2g})")
    if unexplained:
        result.diffs.append(f"the hand-written update of {len(unexplained)} of {sampled} sampled tensors matches "
                            f"no rule of the reference's {ref_opt.get('name')} nor one setting changed: "
                            + "; ".join(unexplained[:3]))
    if clip is not None and not clip_bound and not any(k == "clip" for _, k in assigned):
        result.notes.append(f"the reference's clip at {clip:g} never bound in the replayed first steps: the run's "
                            "clipping is not seen")
    # later windows: the learning rate of each later step (SGD's momentum buffer inferred from the window)
    leaf_rules = [rules[gi] if key is None else dict(_variants(rules[gi], clip))[key] for gi, key in assigned]
    lr_off = []
    used = [first["steps"]]
    for w in windows:
        if w is first or kind != "sgd":
            continue
        wl, wc = rates(w), clip_coefs(w)
        fits = [_fit(r, w, leaf, wl, wc, False) for leaf, r in enumerate(leaf_rules[:len(w["params"][0])])]
        if not fits:
            continue
        used.append(w["steps"])
        pred, actual = (np.concatenate([f[i].ravel() for f in fits]) for i in (2, 3))
        p_next = np.concatenate([_window_arrays(w, leaf)[0][2:].ravel() for leaf in range(len(fits))])
        if _score(pred, actual, p_next) > FIT_SCORE:
            # the prediction is affine in the window's rates (the buffer comes from the first update): the rate
            # that fits best, all of the window's scaled by one factor
            rules_here = list(enumerate(leaf_rules[:len(fits)]))
            base = np.concatenate([_fit(r, w, leaf, wl[:1], wc, False)[2].ravel() for leaf, r in rules_here])
            twice = np.concatenate([_fit(r, w, leaf, [[2 * x for x in wl[0]]], wc, False)[2].ravel()
                                    for leaf, r in rules_here])
            slope = twice - base
            f = float(np.dot(actual - (base - slope), slope) / max(np.dot(slope, slope), 1e-300))
            lr_off.append(f"steps {w['steps'][1]}-{w['steps'][-2]}: the reference's rate {wl[0][-1]:.6g}, the run's "
                          f"updates fit {wl[0][-1] * f:.6g} best (relative error of the replay "
                          f"{_relative(pred, actual):.2g})")
    if lr_off:
        result.diffs.append("learning rate: " + "; ".join(lr_off[:3]))
    by_shape: dict[tuple, tuple[int, str | None]] = {}
    for leaf, (gi, key) in enumerate(assigned):
        by_shape.setdefault(tuple(shapes[leaf]), (gi, key))
    out_groups: dict[tuple[int, str | None], dict[str, Any]] = {}
    for i, (path, shape) in enumerate(zip(paths, shapes)):
        gi, key = assigned[i] if i < len(assigned) else by_shape.get(tuple(shape), (0, None))
        g = out_groups.get((gi, key))
        if g is None:
            g = out_groups[(gi, key)] = {**_group_settings(groups[gi], rules[gi], key), "n_params": 0, "tensors": []}
        g["n_params"] += 1
        g["tensors"].append([path, list(shape)])
    drop_clip = any(k == "clip" for _, k in assigned)
    result.record = {
        "class": f"hand-written update in {samples.get('function')} (replayed as the reference's {ref_opt.get('name')})",
        "name": ref_opt.get("name"), "framework": ref_opt.get("framework"), "first_step": 1,
        "param_groups": list(out_groups.values()), "group_sizes": [g["n_params"] for g in out_groups.values()],
        "clip": None if drop_clip else ref_opt.get("clip"), "changes": [],
        "lr": {"stopped": "a hand-written update: its rate was compared in the replayed windows, not at every step"
                          + (" (an Adam rule: only the first)" if kind != "sgd" else "")}}
    result.measured = {"windows": used, "sampled_tensors": sampled, "tensors": len(paths),
                       "worst_fit_score": round(worst, 3), "fit_score_max": FIT_SCORE}
    if len(paths) > sampled:
        result.notes.append(f"{sampled} of {len(paths)} parameter tensors sampled; the others take the rule of "
                            "a sampled tensor of their shape")
    return result
