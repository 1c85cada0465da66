"""Run the sides of a parity check, and the port's weights loaded back, through ladder's normal run path.

Each side is a run like any other (ladder.runs.execute): the side's profile and environment, its own copy
of the source, the sandbox, the scrubbed environment, the probe, a timeout, run.json and a manifest. Its
directory also holds the side script it ran, its inputs and what it wrote (ladder.parity.side).

Layout of a parity directory:
    <dir>/reference/   the reference side: draws the initial weights and fixed batches (reused when it
                       already ran with the same adapter, steps and seed)
    <dir>/target/      the port's side: inputs.npz (the reference's weights and batches only), parity.npz

Must not: judge (ladder.parity.compare and the checks do), or keep the copy of the code (removed after
each side: the code is in git or in the source directory).
"""

from __future__ import annotations

import json
import os
import shlex
import shutil
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from ladder._util.errors import LadderError
from ladder.migration.spec import Spec, load_spec_protocol
from ladder.parity.compare import ParityReport, compare_sides, tolerance_name
from ladder.runs.execute import Progress, execute_run
from ladder.runs.records import RunRecord

SIDE_SCRIPT = Path(__file__).resolve().with_name("side.py")
SIDE_NAME = "parity_side.py"
SIDES_FILE = "sides.json"
INPUT_GROUPS = ("weights/", "batch/")  # what the target may see of the reference's side


@dataclass(frozen=True)
class ParityRuns:
    reference: Path
    target: Path
    tolerance: str

    def report(self, spec: Spec) -> ParityReport:
        rules = load_spec_protocol(spec).parity
        if self.tolerance not in rules.tolerances:
            raise LadderError(f"the protocol has no [parity.tolerances.{self.tolerance}]",
                              f"set [parity].tolerance to one of {sorted(rules.tolerances)}")
        return compare_sides(self.reference, self.target, rules.tolerances[self.tolerance], self.tolerance)

    def as_option(self) -> dict[str, str]:
        """How the checks find them (CheckContext.options["parity"])."""
        return {"reference": str(self.reference), "target": str(self.target), "tolerance": self.tolerance}

    def save(self, parity_dir: Path) -> Path:
        """sides.json in the parity directory: where its two sides are (the reference may be shared)."""
        path = parity_dir / SIDES_FILE
        rel = {k: os.path.relpath(getattr(self, k), parity_dir) for k in ("reference", "target")}
        path.write_text(json.dumps({**rel, "tolerance": self.tolerance}, indent=1))
        return path

    @classmethod
    def load(cls, parity_dir: Path) -> "ParityRuns":
        path = Path(parity_dir) / SIDES_FILE
        if not path.is_file():
            raise LadderError(f"{parity_dir} is not a parity directory (no {SIDES_FILE})",
                              "pass the directory `ladder parity` wrote")
        data = json.loads(path.read_text())
        base = Path(parity_dir).resolve()
        return cls((base / data["reference"]).resolve(), (base / data["target"]).resolve(), data["tolerance"])


def _parity_spec(spec: Spec):  # -> ParitySpec
    if spec.parity is None:
        raise LadderError(f"{spec.path} has no [parity] table",
                          "add [parity] with reference = \"module:function\" and target = \"module:function\" "
                          "(the adapter convention: ladder/parity/side.py)")
    return spec.parity


IN_RUN_DIR = "@RUN_DIR@/"  # an argument naming a file of the side's run directory, wherever the run runs


def _side_command(args: list[str]) -> str:
    """The command template of a side: {python} and {run_dir} are filled by the run (here or on the profile's
    machine, whose run directory is another path); everything else is literal."""

    def arg(a: str) -> str:
        if a == IN_RUN_DIR.rstrip("/"):
            return "{run_dir}"
        if a.startswith(IN_RUN_DIR):
            return "{run_dir}/" + shlex.quote(a[len(IN_RUN_DIR):]).replace("{", "{{").replace("}", "}}")
        return shlex.quote(a).replace("{", "{{").replace("}", "}}")

    return "{python} " + " ".join(arg(a) for a in [IN_RUN_DIR + SIDE_NAME, *args])


def _execute_side(spec: Spec, profile: str, kind: str, source: Path, run_dir: Path, args: list[str],
                  progress: Progress | None) -> RunRecord:
    """Run the side script in run_dir (which holds it and its input files: a remote run takes them along)."""
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(SIDE_SCRIPT, run_dir / SIDE_NAME)
    timeout = load_spec_protocol(spec).parity.timeout_minutes * 60.0
    seed = _parity_spec(spec).seed
    record = execute_run(spec, profile, kind, seed=seed, source=source, run_dir=run_dir, progress=progress,
                         timeout_s=timeout, command=_side_command([*args, "--out", IN_RUN_DIR.rstrip("/")]))
    shutil.rmtree(run_dir / "work", ignore_errors=True)
    return record


def _reusable(run_dir: Path, adapter: str, steps: int, seed: int) -> bool:
    meta_path = run_dir / "parity.json"
    if not (meta_path.is_file() and (run_dir / "run.json").is_file() and (run_dir / "parity.npz").is_file()):
        return False
    meta = json.loads(meta_path.read_text())
    return (meta.get("error") is None and meta.get("adapter") == adapter and meta.get("steps") == steps
            and meta.get("seed") == seed)


def run_reference_side(spec: Spec, run_dir: Path, progress: Progress | None = None) -> Path:
    """The reference side (reused when it already ran with the same adapter, K and seed)."""
    p = _parity_spec(spec)
    steps = load_spec_protocol(spec).parity.steps
    if not _reusable(run_dir, p.reference, steps, p.seed):
        if run_dir.exists():
            shutil.rmtree(run_dir)
        _execute_side(spec, "reference", "parity", spec.source_dir, run_dir,
                      ["parity", "--adapter", p.reference, "--steps", str(steps), "--seed", str(p.seed)], progress)
    return run_dir


def write_inputs(reference_dir: Path, path: Path) -> None:
    """The reference's initial weights and fixed batches, and nothing it computed from them."""
    with np.load(reference_dir / "parity.npz") as z:
        np.savez(path, **{k: z[k] for k in z.files if k.startswith(INPUT_GROUPS)})


def run_parity(spec: Spec, source: Path, out_dir: Path, reference_dir: Path | None = None,
               progress: Progress | None = None) -> ParityRuns:
    """Both sides: the reference's (or the given one), then the port in `source` on the target profile."""
    p = _parity_spec(spec)
    steps = load_spec_protocol(spec).parity.steps
    ref_dir = run_reference_side(spec, reference_dir or out_dir / "reference", progress)
    tgt_dir = out_dir / "target"
    tolerance = tolerance_name(p.tolerance, spec.profile("target").platform)
    out_dir.mkdir(parents=True, exist_ok=True)
    if (ref_dir / "parity.json").is_file() and json.loads((ref_dir / "parity.json").read_text()).get("error"):
        runs = ParityRuns(ref_dir, tgt_dir, tolerance)  # the report names the reference's failure
        runs.save(out_dir)
        return runs
    if tgt_dir.exists():
        shutil.rmtree(tgt_dir)
    tgt_dir.mkdir(parents=True)
    write_inputs(ref_dir, tgt_dir / "inputs.npz")
    _execute_side(spec, "target", "parity", Path(source), tgt_dir,
                  ["parity", "--adapter", p.target, "--steps", str(steps), "--seed", str(p.seed),
                   "--inputs", IN_RUN_DIR + "inputs.npz"], progress)
    runs = ParityRuns(ref_dir, tgt_dir, tolerance)
    runs.save(out_dir)
    return runs


def exported_weights(spec: Spec, full_run_dir: Path) -> Path | None:
    """The weights a full run exported ([parity].export, kept in its run directory), if any."""
    name = spec.parity.export if spec.parity else None
    if not name:
        return None
    for candidate in (full_run_dir / Path(name).name, full_run_dir / "work" / name):
        if candidate.is_file():
            return candidate
    return None


def run_load_back(spec: Spec, weights: Path, run_dir: Path, progress: Progress | None = None) -> RunRecord:
    """The reference's own evaluation of the port's exported weights, in the reference's environment."""
    p = _parity_spec(spec)
    if not p.evaluate:
        raise LadderError("[parity] names no evaluate adapter", "add evaluate = \"module:function\" to [parity]")
    run_dir.mkdir(parents=True, exist_ok=True)
    shutil.copy2(weights, run_dir / "weights.npz")
    return _execute_side(spec, "reference", "evaluate", spec.source_dir, run_dir,
                         ["evaluate", "--adapter", p.evaluate, "--weights", IN_RUN_DIR + "weights.npz"], progress)
