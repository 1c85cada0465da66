"""Parity benchmark: does tensor-level parity (ladder's L1 `parity`) catch model-definition and optimizer
faults from one batch, and pass faithful ports? Recall, false alarms and the wall time of each port's side.

Usage (from the repository root, with ladder installed):
    python3 benchmarks/parity.py --example
        the example (examples/classifier): its PyTorch/XLA and JAX ports, the demo's planted faults
        (migrations/*.toml, attempt 2), and the detection benchmark's mutants of the repo
        (benchmarks/detection/cases.py) run as torch ports
    python3 benchmarks/parity.py --corpus benchmarks/ports --adapters DIR [--detection results.json]
        a port corpus (benchmarks/ports/FORMAT.md) whose programs have no adapters: DIR mirrors the corpus
        (<program>/reference/parity_adapter.py, <program>/variants/<name>/parity_adapter.py) and the
        adapters are copied into copies of the variants (the corpus is never edited; a variant without an
        adapter is listed as skipped). --detection joins the curve verdicts of benchmarks/detection/bench.py
        so both are printed side by side.

Everything goes through ladder itself: the environments come from ladder's environment cache (the
example's setup commands), `run_parity` runs each side sandboxed with the probe, and the verdict is the
parity check's. The reference side runs once per program; each port's side is timed on its own.
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import time
import tomllib
import zlib
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
EXAMPLE = ROOT / "examples" / "classifier"
sys.path.insert(0, str(HERE / "detection"))

ADAPTER = "parity_adapter.py"
PLATFORM = {"torch": "cpu", "xla": "xla", "jax": "jax-cpu"}


def _profile(stack: str, extra_env: dict[str, str] | None = None) -> str:
    """The [profiles.target] table of a stack, with the example's environments (one build, cached), and a
    variant's own environment (corpus.toml's `env`, e.g. the XLA_FLAGS device count of a pmap port) on top."""
    spec = tomllib.loads((EXAMPLE / ("ladder-jax.toml" if stack == "jax" else "ladder.toml")).read_text())
    name = "reference" if stack == "torch" else "target"
    prof = spec["profiles"][name]
    setup = ", ".join(json.dumps(c) for c in prof["setup"])
    env = ", ".join(f"{k} = {json.dumps(v)}" for k, v in {**prof.get("env", {}), **(extra_env or {})}.items())
    return (f'[profiles.target]\nplatform = "{PLATFORM[stack]}"\nsetup = [{setup}]\npython = "{prof["python"]}"\n'
            f"env = {{ {env} }}\nprice_per_hour = 1.0\n")


def write_spec(ws: Path, name: str, reference: Path, stack: str, parse: dict[str, Any], tolerance: str,
               env: dict[str, str] | None = None) -> Path:
    """A throwaway workspace spec: the reference repo, its torch profile, the port's stack as target."""
    ref = tomllib.loads((EXAMPLE / "ladder.toml").read_text())["profiles"]["reference"]
    parse_toml = "\n".join(f"{k} = {json.dumps(v)}" for k, v in parse.items())
    text = f'''name = "{name}"
source = "{reference}"

[experiment]
short = "{{python}} train.py"
full = "{{python}} train.py"
short_steps = 1
full_steps = 1
expected_minutes_short = 1
expected_minutes_full = 1

[parse]
{parse_toml}

[parity]
reference = "parity_adapter:parity"
target = "parity_adapter:parity"
tolerance = "{tolerance}"

[profiles.reference]
platform = "cpu"
setup = [{", ".join(json.dumps(c) for c in ref["setup"])}]
python = "{ref["python"]}"
env = {{ OMP_NUM_THREADS = "1" }}
price_per_hour = 1.0

{_profile(stack, env)}'''
    ws.mkdir(parents=True, exist_ok=True)
    path = ws / f"{name}-{stack}{'-%08x' % zlib.crc32(json.dumps(env, sort_keys=True).encode()) if env else ''}.toml"
    path.write_text(text)
    return path


@dataclass
class Case:
    program: str
    variant: str
    kind: str  # faithful | benign | fault
    stack: str
    source: Path
    what: str
    skipped: str = ""
    env: dict[str, str] = field(default_factory=dict)  # corpus.toml's per-variant environment


@dataclass
class Outcome:
    program: str
    variant: str
    kind: str
    stack: str
    what: str
    flagged: bool | None  # None: skipped
    first: str  # the first tensor that differs, or the interface problem
    wall_s: float | None  # the port's side, start to end (its environment's start-up included)
    adapter_s: float | None  # the adapter call alone
    magnitude: str = ""  # the first differing tensor's max |diff|, relative difference and cosine
    curves: str = ""  # the detection benchmark's verdict on the same variant, "flagged k/n"
    sides: dict[str, str] | None = None  # the two side runs, as ladder's checks take them (options["parity"])


def example_cases(work: Path) -> tuple[Path, dict[str, Any], list[Case]]:
    """The example's ports, the demo's planted faults and the detection mutants, as copies under `work`."""
    from cases import CASES, apply_edits

    cases: list[Case] = []
    for stack in ("xla", "jax"):
        cases.append(Case("classifier", f"port_{stack}", "faithful", stack, EXAMPLE / "ports" / stack,
                          f"the example's {stack} port"))
        patch = tomllib.loads((EXAMPLE / "migrations" / f"{stack}.toml").read_text())["attempt"][1]
        dst = work / "src" / f"demo_{stack}_fault"
        if dst.exists():
            shutil.rmtree(dst)
        shutil.copytree(EXAMPLE / "ports" / stack, dst, ignore=shutil.ignore_patterns("__pycache__"))
        subprocess.run(["git", "apply", "-"], input=patch["patch"], text=True, cwd=dst, check=True)
        cases.append(Case("classifier", f"demo_{stack}_fault", "fault", stack, dst, patch["summary"]))
    for c in CASES:
        if c.profile != "target" or not c.edits:
            continue
        dst = work / "src" / f"mutant_{c.name}"
        apply_edits(EXAMPLE / "repo", dst, c.edits)
        cases.append(Case("classifier", c.name, c.kind, "torch", dst, c.what))
    parse = tomllib.loads((EXAMPLE / "ladder.toml").read_text())["parse"]
    return EXAMPLE / "repo", parse, cases


def corpus_cases(corpus: Path, adapters: Path, work: Path) -> list[tuple[Path, dict[str, Any], list[Case]]]:
    """Per program: (the reference copy with its adapter, [parse], the variants with theirs)."""
    out = []
    for toml_path in sorted(corpus.glob("*/corpus.toml")):
        pdir, meta = toml_path.parent, tomllib.loads(toml_path.read_text())
        ref_adapter = adapters / pdir.name / "reference" / ADAPTER
        if not ref_adapter.is_file():
            print(f"- {pdir.name}: no reference adapter in {ref_adapter.parent}; skipped", flush=True)
            continue
        ref = work / "src" / pdir.name / "reference"
        if ref.exists():
            shutil.rmtree(ref)
        shutil.copytree(pdir / "reference", ref)
        shutil.copy(ref_adapter, ref / ADAPTER)
        cases = []
        for v in meta.get("variant", []):
            adapter = adapters / pdir.name / "variants" / v["name"] / ADAPTER
            dst = work / "src" / pdir.name / v["name"]
            case = Case(pdir.name, v["name"], v["kind"], v["stack"], dst, v.get("what", ""),
                        env={**meta["spec"].get("env", {}), **v.get("env", {})})
            if not adapter.is_file():
                case.skipped = "no adapter"
            else:
                if dst.exists():
                    shutil.rmtree(dst)
                shutil.copytree(pdir / "variants" / v["name"], dst)
                shutil.copy(adapter, dst / ADAPTER)
            cases.append(case)
        out.append((ref, meta["spec"]["parse"], cases))
    return out


def run_program(work: Path, reference: Path, parse: dict[str, Any], cases: list[Case], tolerance: str) -> list[Outcome]:
    from ladder.migration.spec import load_spec
    from ladder.parity.runs import run_parity
    from ladder.runs.records import RunRecord

    outcomes = []
    program = cases[0].program if cases else reference.name
    ref_dir = work / "runs" / program / "reference"
    for c in cases:
        if c.skipped:
            outcomes.append(Outcome(c.program, c.variant, c.kind, c.stack, c.what, None, c.skipped, None, None))
            continue
        spec = load_spec(write_spec(work / "specs", program, reference, c.stack, parse, tolerance, c.env))
        runs = run_parity(spec, c.source, work / "runs" / program / c.variant, reference_dir=ref_dir)
        report = runs.report(spec)
        first = report.first_failure
        record = RunRecord.load(runs.target) if (runs.target / "run.json").is_file() else None
        meta = json.loads((runs.target / "parity.json").read_text()) if (runs.target / "parity.json").is_file() else {}
        o = Outcome(c.program, c.variant, c.kind, c.stack, c.what, not report.passed,
                    first.tensor if first else ("; ".join(report.problems)[:120] if report.problems else ""),
                    record.wall_s if record else None, meta.get("adapter_s"),
                    f"max|d| {first.max_abs_diff:.2g}, rel {first.rel_diff:.2g}, cos {first.cosine:.4f}" if first else "",
                    sides=runs.as_option())
        outcomes.append(o)
        print(f"  {o.variant:24s} {o.kind:8s} {o.stack:5s} {'FLAGGED' if o.flagged else 'passed ':8s} "
              f"{o.first[:40]:40s} {o.wall_s or 0:6.1f} s", flush=True)
    return outcomes


def curve_verdicts(paths: list[Path] | None) -> dict[tuple[str, str], str]:
    """(program, variant) -> the detection benchmark's calibrated verdict, "flagged k/n", over every results
    file given (one per set: dev, held-out)."""
    out: dict[tuple[str, str], list[bool]] = {}
    for path in paths or []:
        if not path.is_file():
            raise SystemExit(f"--detection {path}: no such file")
        for t in json.loads(path.read_text()).get("trials", []):
            out.setdefault((t["program"], t["variant"]), []).append(bool(t["ladder"]["flagged"]))
    return {k: f"{sum(v)}/{len(v)}" for k, v in out.items()}


def summary(outcomes: list[Outcome], curves: dict[tuple[str, str], str]) -> dict[str, Any]:
    judged = [o for o in outcomes if o.flagged is not None]
    faults = [o for o in judged if o.kind == "fault"]
    ok = [o for o in judged if o.kind in ("faithful", "benign")]
    walls = sorted(o.wall_s for o in judged if o.wall_s is not None)
    print("\n| program | variant | kind | stack | parity | first tensor that differs | magnitude | port side (s) "
          "| curves |")
    print("|---|---|---|---|---|---|---|---|---|")
    for o in outcomes:
        o.curves = curves.get((o.program, o.variant), "")
        verdict = "skipped" if o.flagged is None else "flagged" if o.flagged else "passed"
        wall = "" if o.wall_s is None else f"{o.wall_s:.1f}"
        print(f"| {o.program} | {o.variant} | {o.kind} | {o.stack} | {verdict} | {o.first} | {o.magnitude} | {wall} | "
              f"{o.curves} |")
    s = {"recall": [sum(o.flagged for o in faults), len(faults)],
         "false_alarm": [sum(o.flagged for o in ok), len(ok)],
         "port_side_wall_s": {"median": walls[len(walls) // 2] if walls else None, "max": walls[-1] if walls else None},
         "skipped": sum(o.flagged is None for o in outcomes)}
    print(f"\nparity: fault recall {s['recall'][0]}/{s['recall'][1]}, false alarms on faithful and benign ports "
          f"{s['false_alarm'][0]}/{s['false_alarm'][1]}; port side wall median {s['port_side_wall_s']['median']} s, "
          f"max {s['port_side_wall_s']['max']} s; skipped {s['skipped']}")
    return s


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--example", action="store_true")
    ap.add_argument("--corpus", type=Path)
    ap.add_argument("--adapters", type=Path, help="the corpus's adapters, mirroring its layout")
    ap.add_argument("--detection", type=Path, action="append",
                    help="benchmarks/detection/bench.py's results.json, to print beside (repeat: one per set)")
    ap.add_argument("--work", type=Path, default=Path("/tmp/ladder-parity-bench"))
    ap.add_argument("--tolerance", default="fp32-cpu")
    ap.add_argument("--only", default="", help="comma-separated variant names")
    ap.add_argument("--programs", default="", help="comma-separated program names (a corpus's)")
    ap.add_argument("--out", type=Path, default=HERE / "parity-results.json")
    args = ap.parse_args()
    if not args.example and not (args.corpus and args.adapters):
        ap.error("pass --example, or --corpus DIR --adapters DIR")
    t0 = time.time()
    # the commit the run started from (the adapters are copied at the start; a commit made while it runs is not
    # in it), and whether the tree had uncommitted changes then
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain"], capture_output=True, text=True, cwd=ROOT).stdout.strip())
    programs = ([example_cases(args.work)] if args.example else []) + (
        corpus_cases(args.corpus, args.adapters, args.work) if args.corpus else [])
    only = {x for x in args.only.split(",") if x}
    chosen = {x for x in args.programs.split(",") if x}
    programs = [p for p in programs if not chosen or p[0].parent.name in chosen or p[0].name in chosen]
    outcomes: list[Outcome] = []
    for reference, parse, cases in programs:
        cases = [c for c in cases if not only or c.variant in only]
        print(f"{cases[0].program if cases else reference}: {len(cases)} ports", flush=True)
        outcomes += run_program(args.work, reference, parse, cases, args.tolerance)
    s = summary(outcomes, curve_verdicts(args.detection))
    args.out.write_text(json.dumps({"commit": commit, "dirty": dirty, "wall_s": round(time.time() - t0, 1), "summary": s,
                                    "outcomes": [asdict(o) for o in outcomes]}, indent=1))
    print(f"wall {(time.time() - t0) / 60:.1f} min; written {args.out}")


if __name__ == "__main__":
    main()
