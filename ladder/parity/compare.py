"""Compare what the two sides of a parity check wrote, tensor by tensor, in a stable order.

Owns: the interface stage (the target ran, returned every reference parameter once, in the reference's
shapes, and used every reference weight) and the numeric stage (forward outputs, loss, each parameter's
gradient, each parameter after K steps, in that order, judged with a protocol tolerance), and naming the
first tensor that differs with its magnitude. Must not: run anything, or import a framework (numpy only).
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from ladder.migration.protocol import ParityTolerance

TPU_PLATFORMS = ("tpu", "jax-tpu")


@dataclass(frozen=True)
class TensorRow:
    """One compared tensor: the report's parity table row."""

    tensor: str  # "outputs/logits", "loss", "grads/fc1.weight", "params/fc1.weight"
    max_abs_diff: float
    rel_diff: float  # ||target - reference|| / ||reference|| (params: / ||reference update||)
    cosine: float  # of the two tensors (params: of the two updates)
    passed: bool
    rule: str  # the tolerance it was judged with, in words


@dataclass
class ParityReport:
    tolerance: str
    rows: list[TensorRow] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # the interface stage: every problem at once
    sides: dict[str, Any] = field(default_factory=dict)  # per side: adapter, wall time, error
    # per reference parameter whose gradient was compared: its shape and c, where the target's gradient is the
    # reference's plus c x the initial weights (None where no such term can be told: zero weights, a difference
    # within rounding; absent when a differing gradient is not of that form). A weight decay moved between the
    # loss and the optimizer. With it, whether the loss differs by exactly the L2 term
    # sum (c/2)|w|^2 (None: the loss was not compared, or it agrees as it is).
    decay_terms: dict[str, dict[str, Any]] = field(default_factory=dict)
    decay_loss_agrees: bool | None = None

    @property
    def first_failure(self) -> TensorRow | None:
        return next((r for r in self.rows if not r.passed), None)

    @property
    def passed(self) -> bool:
        return not self.problems and bool(self.rows) and self.first_failure is None

    def as_dict(self) -> dict[str, Any]:
        first = self.first_failure
        return {"tolerance": self.tolerance, "passed": self.passed, "problems": self.problems,
                "first_failure": asdict(first) if first else None, "rows": [asdict(r) for r in self.rows],
                "sides": self.sides, "decay_terms": self.decay_terms,
                "decay_loss_agrees": self.decay_loss_agrees}


def tolerance_name(choice: str, platform: str) -> str:
    """The spec's [parity].tolerance, with auto resolved by the target's platform."""
    if choice != "auto":
        return choice
    return "tpu" if platform in TPU_PLATFORMS else "fp32-cpu"


def _finite(x: float) -> float:
    return float(x) if math.isfinite(x) else float("inf")


def _measure(a: np.ndarray, b: np.ndarray, base: np.ndarray | None = None) -> tuple[float, float, float]:
    """(max |a - b|, ||a - b|| / ||b - base||, cosine of a - base and b - base); base 0 when None."""
    a64, b64 = a.astype(np.float64).ravel(), b.astype(np.float64).ravel()
    ref = b64 if base is None else b64 - base.astype(np.float64).ravel()
    mine = a64 if base is None else a64 - base.astype(np.float64).ravel()
    diff = a64 - b64
    max_abs = float(np.max(np.abs(diff))) if diff.size else 0.0
    norm_ref, norm_mine, norm_diff = (float(np.linalg.norm(v)) for v in (ref, mine, diff))
    rel = norm_diff / norm_ref if norm_ref > 0 else (0.0 if norm_diff == 0 else math.inf)
    if norm_ref > 0 and norm_mine > 0:
        cos = float(np.dot(ref, mine) / (norm_ref * norm_mine))
    else:
        cos = 1.0 if norm_ref == norm_mine == 0 else 0.0
    return _finite(max_abs), _finite(rel), cos if math.isfinite(cos) else 0.0


def _row_outputs(name: str, a: np.ndarray, b: np.ndarray, tol: ParityTolerance) -> TensorRow:
    max_abs, rel, cos = _measure(a, b)
    a64, b64 = a.astype(np.float64), b.astype(np.float64)
    ok = bool(np.all(np.abs(a64 - b64) <= tol.output_atol + tol.output_rtol * np.abs(b64)))
    return TensorRow(f"outputs/{name}", max_abs, rel, cos, ok,
                     f"|diff| <= {tol.output_atol:g} + {tol.output_rtol:g} x |reference|")


def _row_loss(a: float, b: float, tol: ParityTolerance) -> TensorRow:
    max_abs, _, _ = _measure(np.array([a]), np.array([b]))
    rel = max_abs / abs(b) if b else (0.0 if max_abs == 0 else math.inf)
    return TensorRow("loss", max_abs, _finite(rel), 1.0 if a * b > 0 or a == b else 0.0,
                     bool(rel <= tol.loss_rtol), f"rel <= {tol.loss_rtol:g}")


def _row_grad(name: str, a: np.ndarray, b: np.ndarray, tol: ParityTolerance) -> TensorRow:
    max_abs, rel, cos = _measure(a, b)
    return TensorRow(f"grads/{name}", max_abs, rel, cos, rel <= tol.grad_rel and cos >= tol.grad_min_cos,
                     f"rel <= {tol.grad_rel:g}, cos >= {tol.grad_min_cos:g}")


def _row_param(name: str, a: np.ndarray, b: np.ndarray, init: np.ndarray, tol: ParityTolerance) -> TensorRow:
    max_abs, rel, cos = _measure(a, b, init)
    return TensorRow(f"params/{name}", max_abs, rel, cos, rel <= tol.param_rel and cos >= tol.param_min_cos,
                     f"rel to the update <= {tol.param_rel:g}, cos of updates >= {tol.param_min_cos:g}")


def _decay_term(a: np.ndarray, b: np.ndarray, init: np.ndarray, row: TensorRow,
                tol: ParityTolerance) -> float | None:
    """c where the target's gradient a is the reference's b plus c x init: an L2 term (c/2)|w|^2 in one side's
    loss that the other side's optimizer applies as weight decay. For a gradient beyond tolerance, c when the
    rest is within it, else nan (not of that form). For one within it, c when the term explains most of the
    small difference, else None (too small to tell: zero weights, equal gradients, or rounding)."""
    a64, b64, w = (v.astype(np.float64).ravel() for v in (a, b, init))
    ww = float(np.dot(w, w))
    if ww == 0:
        return None if row.passed else math.nan
    c = float(np.dot(a64 - b64, w) / ww)
    _, rel, cos = _measure(a64 - c * w, b64)
    if row.passed:
        return c if row.rel_diff > 0 and rel <= row.rel_diff / 2 else None
    return c if rel <= tol.grad_rel and cos >= tol.grad_min_cos else math.nan


@dataclass
class Side:
    """What one side wrote: parity.json (meta) and parity.npz (arrays), or why there is nothing."""

    meta: dict[str, Any]
    arrays: dict[str, dict[str, np.ndarray]]
    loss: float | None
    error: str | None

    @classmethod
    def load(cls, run_dir: Path) -> "Side":
        meta_path, npz_path = Path(run_dir) / "parity.json", Path(run_dir) / "parity.npz"
        if not meta_path.is_file():
            return cls({}, {}, None, f"{run_dir} has no parity.json: the side did not run to the end")
        meta = json.loads(meta_path.read_text())
        if meta.get("error") or not npz_path.is_file():
            return cls(meta, {}, None, meta.get("error") or "no parity.npz")
        groups: dict[str, dict[str, np.ndarray]] = {}
        with np.load(npz_path) as z:
            loss = float(z["loss"]) if "loss" in z.files else None
            for key in z.files:
                group, _, name = key.partition("/")
                if name:
                    groups.setdefault(group, {})[name] = z[key]
        order = meta.get("order") or {}
        arrays = {g: {n: groups.get(g, {})[n] for n in order.get(g, []) if n in groups.get(g, {})} for g in order}
        return cls(meta, arrays, loss, None)

    def group(self, name: str) -> dict[str, np.ndarray]:
        return self.arrays.get(name, {})


def interface_problems(ref: Side, tgt: Side) -> list[str]:
    """Everything wrong with the transplant and the target's answer, at once (empty: the stage passed)."""
    if ref.error:
        return [f"the reference side failed: {ref.error}"]
    if tgt.error:
        return [f"the target side failed: {tgt.error}"]
    weights = ref.group("weights")
    problems: list[str] = []
    for group in ("grads", "params"):
        got = tgt.group(group)
        missing = [n for n in weights if n not in got]
        extra = [n for n in got if n not in weights]
        shaped = [f"{n} {list(got[n].shape)} (reference {list(weights[n].shape)})" for n in weights
                  if n in got and got[n].shape != weights[n].shape]
        if missing:
            problems.append(f"{group}: no {', '.join(missing[:8])}" + (" ..." if len(missing) > 8 else ""))
        if extra:
            problems.append(f"{group}: names the reference does not have: {', '.join(extra[:8])}")
        if shaped:
            problems.append(f"{group}: shapes differ (a transpose missing?): {', '.join(shaped[:8])}")
    outs_ref, outs_tgt = ref.group("outputs"), tgt.group("outputs")
    for name, arr in outs_ref.items():
        if name not in outs_tgt:
            problems.append(f"outputs: no {name!r}")
        elif outs_tgt[name].shape != arr.shape:
            problems.append(f"outputs/{name}: shape {list(outs_tgt[name].shape)}, reference {list(arr.shape)}")
    reads = tgt.meta.get("reads") or {}
    unused = [n for n in weights if reads.get(n, 0) == 0]
    if reads and unused:
        problems.append(f"weights never read by the target's adapter (a layer left at its own init?): "
                        f"{', '.join(unused[:8])}")
    problems += _transplant_problems(tgt.meta.get("transplant") or [], weights)
    return problems


def _transplant_problems(transplant: list[dict[str, Any]], weights: dict[str, np.ndarray]) -> list[str]:
    """The adapter's declared name map: every reference parameter used once, each target filled once, and a
    transpose only where there is something to transpose."""
    if not transplant:
        return []
    problems: list[str] = []
    sources: dict[str, list[str]] = {}
    targets: dict[str, int] = {}
    for item in transplant:
        src, dst = str(item.get("source")), str(item.get("target"))
        sources.setdefault(src, []).append(dst)
        targets[dst] = targets.get(dst, 0) + 1
        if src not in weights:
            problems.append(f"transplant: {dst} comes from {src}, which the reference does not have")
        elif item.get("transpose") and weights[src].ndim < 2:
            problems.append(f"transplant: {src} is declared transposed but has {weights[src].ndim} dimension(s)")
    twice = {s: d for s, d in sources.items() if len(d) > 1}
    if twice:
        problems.append("transplant: reference parameters used more than once: "
                        + "; ".join(f"{s} -> {', '.join(d)}" for s, d in list(twice.items())[:5]))
    unused = [n for n in weights if n not in sources]
    if unused:
        problems.append(f"transplant: reference parameters never used: {', '.join(unused[:8])}")
    filled_twice = [t for t, n in targets.items() if n > 1]
    if filled_twice:
        problems.append(f"transplant: target parameters filled more than once: {', '.join(filled_twice[:8])}")
    return problems


def compare_sides(reference_dir: Path, target_dir: Path, tol: ParityTolerance, tolerance: str) -> ParityReport:
    """The parity report of two side runs: the interface stage, then every tensor in the stable order."""
    ref, tgt = Side.load(reference_dir), Side.load(target_dir)
    report = ParityReport(tolerance=tolerance, sides={
        "reference": {"dir": str(reference_dir), "adapter": ref.meta.get("adapter"), "error": ref.error,
                      "adapter_s": ref.meta.get("adapter_s"), "wall_s": ref.meta.get("wall_s")},
        "target": {"dir": str(target_dir), "adapter": tgt.meta.get("adapter"), "error": tgt.error,
                   "adapter_s": tgt.meta.get("adapter_s"), "wall_s": tgt.meta.get("wall_s")}})
    report.problems = interface_problems(ref, tgt)
    if ref.error or tgt.error:
        return report
    outs_tgt, grads_tgt, params_tgt = tgt.group("outputs"), tgt.group("grads"), tgt.group("params")
    for name, arr in ref.group("outputs").items():
        if name in outs_tgt and outs_tgt[name].shape == arr.shape:
            report.rows.append(_row_outputs(name, outs_tgt[name], arr, tol))
    if ref.loss is not None and tgt.loss is not None:
        report.rows.append(_row_loss(tgt.loss, ref.loss, tol))
    weights, grads_ref, params_ref = ref.group("weights"), ref.group("grads"), ref.group("params")
    for name, init in weights.items():  # the reference's parameter order
        if name in grads_ref and name in grads_tgt and grads_tgt[name].shape == init.shape:
            row = _row_grad(name, grads_tgt[name], grads_ref[name], tol)
            report.rows.append(row)
            c = _decay_term(grads_tgt[name], grads_ref[name], init, row, tol)
            if c is None or math.isfinite(c):
                report.decay_terms[name] = {"c": c, "shape": list(init.shape)}
    loss_row = next((r for r in report.rows if r.tensor == "loss"), None)
    if loss_row is not None and not loss_row.passed and report.decay_terms:
        l2 = sum(float(t["c"] or 0.0) / 2 * float(np.sum(weights[n].astype(np.float64) ** 2))
                 for n, t in report.decay_terms.items())
        report.decay_loss_agrees = abs(tgt.loss - ref.loss - l2) <= tol.loss_rtol * abs(ref.loss)
    for name, init in weights.items():
        if name in params_ref and name in params_tgt and params_tgt[name].shape == init.shape:
            report.rows.append(_row_param(name, params_tgt[name], params_ref[name], init, tol))
    return report
