"""One side of a parity check, run inside that side's environment (the reference's or the port's).

ladder copies this file into a parity run's directory and runs it there through the normal run path
(sandbox, timeout, scrubbed environment, probe, run.json). It imports the side's adapter from the
run's copy of the source, calls it, and writes what it returned as arrays for ladder to compare.

Owns: the adapter calling convention and the files a side writes. Must not: compare anything (ladder
does that, outside this environment), import ladder, or import any framework itself: standard library
and numpy only, because it runs in the environment under test.

Adapter convention (`[parity] reference` / `target` name it as `module:function`):

    function(weights, batch, *, steps, seed) -> dict
        weights  a read-only mapping: reference parameter name -> numpy array, or None on the reference
                 side, where the adapter draws the reference's own initial weights (seeded) and returns
                 them under "weights"
        batch    a mapping of numpy arrays (one fixed training batch), or None on the reference side,
                 where the adapter draws it from the reference's data pipeline and returns it as "batch"
        steps    K: the optimizer steps to take on that batch with dropout off
      returns    "outputs": array or {name: array}, the forward outputs on the batch (dropout off)
                 "loss": the training loss on the batch, before any step
                 "grads": {reference name: array}, the gradient of that loss, in the reference's layout
                 "params": {reference name: array}, the parameters after `steps` optimizer steps
                 "transplant" (optional): [{"target": name, "source": reference name, "transpose": bool}]

    evaluate(weights) -> float | {"metric": float}     (`[parity] evaluate`, reference side only)
        loads trained weights into the reference model and runs the reference's own evaluation.
        `weights.require({name: shape})` lists missing, unexpected and mis-shaped names at once and
        refuses the load; without it, a name never read counts as unexpected.

Files written in the output directory: parity.npz (`weights/`, `batch/`, `outputs/`, `loss`, `grads/`,
`params/`) and parity.json (the order of every group, how often each weight was read, the transplant,
timings, the error if the adapter raised); evaluate.json for an evaluation.
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
import traceback
from collections.abc import Mapping

import numpy as np

GROUPS = ("weights", "batch", "outputs", "grads", "params")


class WeightsRefused(Exception):
    """Raised by Weights.require when the names or shapes do not match the model's."""


class Weights(Mapping):
    """Read-only named arrays that count how often each name is read, so that ladder can check that
    the adapter used every reference parameter once."""

    def __init__(self, arrays: dict) -> None:
        self._arrays = dict(arrays)
        self.reads = {k: 0 for k in self._arrays}
        self.problems: dict = {}

    def __getitem__(self, key):
        value = self._arrays[key]
        self.reads[key] += 1
        return value

    def __iter__(self):
        return iter(self._arrays)

    def __len__(self) -> int:
        return len(self._arrays)

    def shapes(self) -> dict:
        return {k: list(v.shape) for k, v in self._arrays.items()}

    def require(self, shapes: Mapping) -> None:
        """Strict load: the model's names and shapes must be exactly these arrays' (all problems at once)."""
        want = {str(k): [int(n) for n in v] for k, v in shapes.items()}
        have = self.shapes()
        self.problems = {
            "missing": sorted(set(want) - set(have)),
            "unexpected": sorted(set(have) - set(want)),
            "mis_shaped": {k: {"expected": want[k], "found": have[k]} for k in sorted(set(want) & set(have))
                           if want[k] != have[k]},
        }
        if any(self.problems.values()):
            raise WeightsRefused(json.dumps(self.problems))


def _adapter(name: str):
    module, _, function = name.partition(":")
    if not module or not function:
        raise ValueError(f"adapter {name!r} is not module:function")
    return getattr(importlib.import_module(module), function)


def _arrays(value, what: str) -> dict:
    if value is None:
        return {}
    if isinstance(value, Mapping):
        return {str(k): np.asarray(v) for k, v in value.items()}
    return {what: np.asarray(value)}


def _read_npz(path: str, group: str) -> dict:
    with np.load(path) as z:
        prefix = group + "/"
        return {k[len(prefix):]: z[k] for k in z.files if k.startswith(prefix)}


def _write_json(path: str, data: dict) -> None:
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1, default=repr)
    os.replace(tmp, path)


def _failed(meta: dict, e: Exception) -> int:
    traceback.print_exc()
    meta["error"] = f"{type(e).__name__}: {e}"
    return 1


def _finish(meta: dict, weights: "Weights | None", t0: float, path: str, rc: int) -> int:
    """Record how often each weight was read and the time taken, write the side's JSON, say so."""
    if weights is not None:
        meta["reads"] = dict(weights.reads)
    meta["wall_s"] = round(time.perf_counter() - t0, 3)
    _write_json(path, meta)
    print(f"{meta['mode']} side done: {'ok' if rc == 0 else meta['error']}", flush=True)
    return rc


def run_parity(args: argparse.Namespace) -> int:
    meta: dict = {"mode": "parity", "adapter": args.adapter, "steps": args.steps, "seed": args.seed,
                  "side": "reference" if not args.inputs else "target", "error": None}
    t0 = time.perf_counter()
    weights = None
    try:
        fn = _adapter(args.adapter)
        batch = None
        if args.inputs:
            weights = Weights(_read_npz(args.inputs, "weights"))
            batch = _read_npz(args.inputs, "batch")
        meta["import_s"] = round(time.perf_counter() - t0, 3)
        t1 = time.perf_counter()
        out = fn(weights, batch, steps=args.steps, seed=args.seed)
        meta["adapter_s"] = round(time.perf_counter() - t1, 3)
        if not isinstance(out, Mapping):
            raise TypeError(f"the adapter returned {type(out).__name__}, not a dict")
        groups = {"weights": _arrays(out.get("weights"), "weights") if weights is None else {},
                  "batch": _arrays(out.get("batch"), "batch") if batch is None else {},
                  "outputs": _arrays(out.get("outputs"), "outputs"),
                  "grads": _arrays(out.get("grads"), "grads"),
                  "params": _arrays(out.get("params"), "params")}
        missing = [g for g in ("outputs", "grads", "params") if not groups[g]]
        missing += ["loss"] if out.get("loss") is None else []
        if weights is None:
            missing += [g for g in ("weights", "batch") if not groups[g]]
        if missing:
            raise ValueError(f"the adapter returned no {', '.join(missing)}")
        arrays = {f"{g}/{k}": v for g in GROUPS for k, v in groups[g].items()}
        arrays["loss"] = np.asarray(out["loss"], dtype=np.float64).reshape(())
        np.savez(os.path.join(args.out, "parity.npz"), **arrays)
        meta["order"] = {g: list(groups[g]) for g in GROUPS}
        meta["shapes"] = {g: {k: list(v.shape) for k, v in groups[g].items()} for g in GROUPS}
        meta["transplant"] = list(out.get("transplant") or [])
        rc = 0
    except Exception as e:
        rc = _failed(meta, e)
    return _finish(meta, weights, t0, os.path.join(args.out, "parity.json"), rc)


def run_evaluate(args: argparse.Namespace) -> int:
    meta: dict = {"mode": "evaluate", "adapter": args.adapter, "weights": args.weights, "error": None,
                  "metric": None}
    t0 = time.perf_counter()
    weights = None
    try:
        with np.load(args.weights) as z:
            weights = Weights({k: z[k] for k in z.files})
        result = _adapter(args.adapter)(weights)
        metric = result.get("metric") if isinstance(result, Mapping) else result
        meta["metric"] = float(metric)
        rc = 0
    except WeightsRefused:
        meta["error"] = "the weights do not load strictly into the reference model"
        rc = 1
    except Exception as e:
        rc = _failed(meta, e)
    if weights is not None:
        meta["strict"] = weights.problems or None
        meta["shapes"] = weights.shapes()
    return _finish(meta, weights, t0, os.path.join(args.out, "evaluate.json"), rc)


def main(argv: list | None = None) -> int:
    p = argparse.ArgumentParser(description="One side of a ladder parity check.")
    sub = p.add_subparsers(dest="mode", required=True)
    par = sub.add_parser("parity")
    par.add_argument("--adapter", required=True)
    par.add_argument("--inputs", default="", help="the reference side's parity.npz (target side only)")
    par.add_argument("--steps", type=int, required=True)
    par.add_argument("--seed", type=int, default=0)
    par.add_argument("--out", required=True)
    ev = sub.add_parser("evaluate")
    ev.add_argument("--adapter", required=True)
    ev.add_argument("--weights", required=True)
    ev.add_argument("--out", required=True)
    args = p.parse_args(argv)
    sys.path.insert(0, os.getcwd())  # the run's copy of the side's source: where its adapter lives
    return run_parity(args) if args.mode == "parity" else run_evaluate(args)


if __name__ == "__main__":
    sys.exit(main())
