"""Detection benchmark on the port corpus (benchmarks/ports/): does ladder say yes to faithful and benign
ports and no to silent faults, on ports no rule was tuned on, beside the study's fixed rule?

Usage (from the repository root, with ladder installed):
    python3 benchmarks/detection/bench.py --set dev          # the half rules may be tuned on
    python3 benchmarks/detection/bench.py --set held_out     # once: the half written before any rule was tuned
    python3 benchmarks/detection/bench.py --reuse ...        # re-judge the runs kept in --work, run nothing

Everything goes through ladder itself: the environments come from ladder's environment cache (the same
setup commands as examples/classifier, so nothing depends on this machine's paths), `execute_run`
captures every run with the probe (the reference's seeds are kept under --work as the baseline pool),
and `run_ladder` judges. A trial is one variant at one seed, judged as the supervisor judges an attempt: its
short run up to L2, its full run up to L3 (L1 again on the full run, then L3). It is flagged when a
check of L1, L2 or L3 on either run does not pass (undecided after the seeds it asked for: flagged, and
counted apart).

Seeds, paired as the supervisor pairs them: a trial at seed s is compared by the fixed rule with the
reference run at seed s. The calibrated verdict never sees that seed: it starts from the default
baseline (5 short, 3 full seeds) drawn from the other reference seeds, and, when undecided, adds the
seeds it asks for from the rest (up to what was stored). The reference's own runs at each seed are
judged the same way against the others ("the reference's other seeds"): a faithful trial that needs no
extra run.
"""

from __future__ import annotations

import argparse
import warnings
import datetime
import json
import math
import subprocess
import sys
import time
import tomllib
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent.parent
CORPUS = ROOT / "benchmarks" / "ports"
sys.path.insert(0, str(ROOT))

from ladder.baselines.store import Baseline, BaselineMeta  # noqa: E402
from ladder.checks import CheckContext, run_ladder  # noqa: E402
from ladder.checks.results import CLIMBS  # noqa: E402
from ladder.migration.spec import load_spec, load_spec_protocol  # noqa: E402
from ladder.runs.execute import execute_run  # noqa: E402
from ladder.migration.spec import SpecWarning  # noqa: E402

# the corpus's specs were written before the spec warnings existed ('\\S+' groups): said once here, not per run
warnings.filterwarnings("ignore", category=SpecWarning)
from ladder.runs.records import RunRecord  # noqa: E402

PLATFORM = {"torch": "cpu", "xla": "xla", "jax": "jax-cpu"}
DEFAULT_SHORT, DEFAULT_FULL = 5, 3  # the baseline a user gets from `ladder baseline`


def _setups() -> dict[str, dict[str, Any]]:
    """The environments, exactly as the example's specs define them (one cache for tests, demo and this)."""
    ex = ROOT / "examples" / "classifier"
    xla = tomllib.loads((ex / "ladder.toml").read_text())["profiles"]
    jax = tomllib.loads((ex / "ladder-jax.toml").read_text())["profiles"]
    return {"torch": xla["reference"], "xla": xla["target"], "jax": jax["target"]}


def _toml(v: Any) -> str:
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{k} = {_toml(x)}" for k, x in v.items()) + " }"
    raise TypeError(v)


def _table(name: str, d: dict[str, Any]) -> str:
    return f"[{name}]\n" + "".join(f"{k} = {_toml(v)}\n" for k, v in d.items()) + "\n"


def write_spec(program: dict[str, Any], ws: Path, variants: list[dict[str, Any]]) -> Path:
    """A ladder.toml for the program: the reference profile and one profile per variant."""
    setups = _setups()
    spec = program["spec"]
    exp = {k: spec[k] for k in ("short", "full", "short_steps", "full_steps", "expected_minutes_short",
                                "expected_minutes_full")}
    text = f'name = "{program["program"]}"\nsource = "reference"\nprotocol = "ncsu"\n\n'
    text += _table("experiment", exp) + _table("parse", spec["parse"])
    if spec.get("probe"):
        text += _table("probe", spec["probe"])
    base_env = {"OMP_NUM_THREADS": "1", **spec.get("env", {})}

    def profile(stack: str, env: dict[str, str]) -> dict[str, Any]:
        s = setups[stack]
        return {"platform": PLATFORM[stack], "setup": s["setup"], "python": s["python"],
                "env": {**s.get("env", {}), **base_env, **env}, "price_per_hour": 1.0, "chips": 1}

    text += _table("profiles.reference", profile("torch", {}))
    text += _table("profiles.target", profile("torch", {}))
    for v in variants:
        text += _table(f"profiles.v_{v['name']}", profile(v["stack"], v.get("env", {})))
    path = ws / "ladder.toml"
    path.write_text(text)
    return path


# ---------------------------------------------------------------- runs

@dataclass
class Job:
    program: str
    profile: str
    kind: str
    seed: int
    source: Path
    run_dir: Path


def _execute(spec_path: Path, job: Job, reuse: bool) -> RunRecord | None:
    """The job's run: recorded, or executed. A run the infrastructure failed (fake CPU devices' collectives
    starved by the machine's load) is started again, [infrastructure].max_retries times, as the supervisor
    does; every try keeps its own directory (`<run_dir>-try2`, ...) and the last one stands."""
    spec = load_spec(spec_path)
    tries = 1 + load_spec_protocol(spec).infrastructure.max_retries
    rec = None
    for i in range(tries):
        run_dir = job.run_dir if i == 0 else job.run_dir.with_name(f"{job.run_dir.name}-try{i + 1}")
        last, rec = rec, _recorded(run_dir)
        if rec is None:
            if reuse:
                return last  # only what was recorded: the last try, or nothing
            t0 = time.time()
            rec = execute_run(spec, job.profile, job.kind, job.seed, source=job.source, run_dir=run_dir)
            print(f"  {job.program} {job.profile} {job.kind} s{job.seed}: exit {rec.exit_code} metric {rec.metric} "
                  f"({time.time() - t0:.0f}s)" + (f" -- infrastructure: {rec.infrastructure.detail[:120]}"
                                                  if rec.infrastructure else ""), flush=True)
        if rec.infrastructure is None:
            return rec
    return rec


def _recorded(run_dir: Path) -> RunRecord | None:
    if (run_dir / "run.json").exists():
        try:
            rec = RunRecord.load(run_dir)
            if rec.ended_at is not None:
                return rec
        except Exception:
            pass
    return None


# ---------------------------------------------------------------- judging

def _baseline(root: Path, shorts: list[RunRecord], fulls: list[RunRecord]) -> Baseline:
    meta = BaselineMeta(name="bench", version=1, created_at=0.0, profile="reference", platform="cpu",
                        seeds=[r.seed for r in shorts], full_seeds=[r.seed for r in fulls], spec_sha256="",
                        protocol="ncsu")
    return Baseline(root, meta, shorts, fulls)


def _judge(run: RunRecord, baseline: Baseline, protocol, platform: str, up_to: str, full_run=None,
           options: dict[str, Any] | None = None):
    ctx = CheckContext(run=run, protocol=protocol, baseline=baseline, expected_platform=platform, full_run=full_run,
                       options=options or {})
    return run_ladder(ctx, up_to=up_to)


def _more_seeds(result) -> int:
    return max([int(((c.details or {}).get("calibrated") or {}).get("more_seeds") or 0)
                for c in result.checks if c.status == "undecided"] or [0])


@dataclass
class Verdict:
    flagged: bool
    undecided: bool
    failed: list[str] = field(default_factory=list)
    extra_seeds: int = 0


def judge_trial(short: RunRecord, full: RunRecord, pool_short: list[RunRecord], pool_full: list[RunRecord],
                protocol, platform: str, rule: str, seed: int, options: dict[str, Any] | None = None,
                variant: bool = True) -> Verdict:
    """Judge one trial as the supervisor would. `rule`: "ladder" (calibrated, starting from the default
    baseline of the other seeds, seeds added when undecided) or "fixed" (the paired reference seed). `options`:
    the checks' options, e.g. {"parity": sides} for ladder with its L1 parity check. A port's trial is run at a
    seed the supervisor's baseline holds: the calibrated verdict keeps that seed out of its band (as for the
    reference's own trials), and the metric check gets the reference's run at that seed apart, as
    options["same_seed"] (`variant`=False for the reference's own trials, which would meet themselves)."""
    if variant and rule == "ladder":
        same = {k: next((r for r in pool if r.seed == seed), None) for k, pool in (("short", pool_short),
                                                                                  ("full", pool_full))}
        options = {**(options or {}), "same_seed": {k: r for k, r in same.items() if r is not None}}
    judge = lambda *a, **k: _judge(*a, **k, options=options)  # noqa: E731
    if rule == "fixed":
        proto = protocol.model_copy(update={"l1": protocol.l1.model_copy(update={"rule": "fixed"})})
        ps = [r for r in pool_short if r.seed == seed] or pool_short[:1]
        pf = [r for r in pool_full if r.seed == seed] or pool_full[:1]
        base = _baseline(Path("."), ps, pf)
        results = [judge(short, base, proto, platform, "L2"), judge(full, base, proto, platform, "L3")]
        extra = 0
    else:
        others_s = [r for r in pool_short if r.seed != seed]
        others_f = [r for r in pool_full if r.seed != seed]
        n_s, n_f = DEFAULT_SHORT, DEFAULT_FULL
        base = _baseline(Path("."), others_s[:n_s], others_f[:n_f])
        results = [judge(short, base, protocol, platform, "L2"), judge(full, base, protocol, platform, "L3")]
        extra = 0
        for i, (res, kind) in enumerate(zip(results, ("short", "full"))):
            more = _more_seeds(res)
            if not more:
                continue
            # the supervisor's rule (ladder.supervisor.steps.seeds_wanted), on the runs this benchmark stored
            cap = protocol.calibrated.max_seeds
            if kind == "short":
                n_s2 = min(n_s + more, cap, len(others_s))
                base2 = _baseline(Path("."), others_s[:n_s2], others_f[:n_f])
                extra += n_s2 - n_s
            else:
                n_f2 = min(max(n_f + more, protocol.calibrated.min_seeds), cap, len(others_f))
                base2 = _baseline(Path("."), others_s[:n_s], others_f[:n_f2])
                extra += n_f2 - n_f
            run = short if kind == "short" else full
            results[i] = judge(run, base2, protocol, platform, "L2" if kind == "short" else "L3")
    failed, undecided = [], False
    for res, kind in zip(results, ("short", "full")):
        for c in res.checks:
            if c.level in ("L1", "L2", "L3") and c.status not in CLIMBS:
                failed.append(f"{kind}:{c.level}/{c.name}:{c.status}")
                undecided |= c.status == "undecided"
    return Verdict(bool(failed), undecided, failed, extra)


def load_parity(paths: list[Path]) -> dict[tuple[str, str], dict[str, Any]]:
    """(program, variant) -> benchmarks/parity.py's outcome (flagged, first tensor that differs)."""
    out: dict[tuple[str, str], dict[str, Any]] = {}
    for p in paths:
        for o in json.loads(p.read_text())["outcomes"]:
            out[(o["program"], o["variant"])] = o
    return out


def join_parity(t: dict[str, Any], outcome: dict[str, Any] | None) -> None:
    """The rule 'ladder + parity': ladder's verdict with the L1 parity check (K steps on the reference's weights
    and batches) joined; a variant parity did not run keeps ladder's verdict (the report names such variants).
    The reference against itself is parity's identity: never flagged by it."""
    lad = t["ladder"]
    flagged = bool(outcome and outcome.get("flagged")) and t["variant"] != "reference"
    failed = list(lad["failed"])
    if outcome is not None and not flagged:
        # with a passing parity run, optimizer_unchanged verifies an update written by hand (ladder.checks.l2:
        # the parameters after K steps match) instead of saying not_checked
        failed = [f for f in failed if not f.endswith("L2/optimizer_unchanged:not_checked")]
    failed += [f"parity:L1/parity:failed ({outcome.get('first', '')})"] if flagged else []
    t["parity"] = None if outcome is None and t["variant"] != "reference" else {
        "flagged": flagged, "first": (outcome or {}).get("first", "")}
    t["ladder_parity"] = {**lad, "flagged": bool(failed), "failed": failed,
                          "undecided": any(f.endswith(":undecided") for f in failed),
                          "right_check": lad["right_check"] or (flagged and caught_by_expected(
                              Verdict(True, False, ["parity:L1/parity:failed"]), t["expect"]))}


def verdict_record(v: Verdict, expect: list[str]) -> dict[str, Any]:
    """A trial's verdict under one rule, as results.json keeps it."""
    return {"flagged": v.flagged, "undecided": v.undecided, "failed": v.failed, "extra_seeds": v.extra_seeds,
            "right_check": caught_by_expected(v, expect)}


def caught_by_expected(v: Verdict, expect: list[str]) -> bool:
    names = [f.split(":")[1] for f in v.failed if f.endswith(":failed")]
    return any(n == e or n.startswith(e + "/") for n in names for e in expect)


# ---------------------------------------------------------------- figures

def interval(k: int, n: int, conf: float = 0.95) -> tuple[float, float]:
    """Clopper-Pearson exact interval for k successes in n."""
    from scipy.stats import beta

    if n == 0:
        return (math.nan, math.nan)
    a = (1 - conf) / 2
    lo = 0.0 if k == 0 else float(beta.ppf(a, k, n - k + 1))
    hi = 1.0 if k == n else float(beta.ppf(1 - a, k + 1, n - k))
    return lo, hi


def _commit() -> tuple[str, bool]:
    """HEAD, and whether ladder's code, its protocols or the corpus differ from it in the work tree."""
    commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, cwd=ROOT).stdout.strip()
    dirty = bool(subprocess.run(["git", "status", "--porcelain", "--", "ladder", "protocols", "benchmarks/ports"],
                                capture_output=True, text=True, cwd=ROOT).stdout.strip())
    return commit, dirty


def rate(k: int, n: int) -> str:
    if n == 0:
        return "-"
    lo, hi = interval(k, n)
    return f"{k}/{n} = {k / n:.2f} [{lo:.2f}, {hi:.2f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--work", type=Path, default=Path("/tmp/ladder-ports"))
    ap.add_argument("--set", choices=["dev", "held_out", "all"], default="dev")
    ap.add_argument("--programs", default="", help="comma-separated program names (default: all in the corpus)")
    ap.add_argument("--trials", type=int, default=2, help="seeds per variant (0, 1, ...)")
    # the supervisor extends an undecided baseline up to [calibrated] max_seeds (10): the pool holds that many
    # seeds besides the trial's own, so an undecided verdict gets the seeds it asks for
    ap.add_argument("--baseline-short", type=int, default=11)
    ap.add_argument("--baseline-full", type=int, default=11)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--round", type=int, default=1,
                    help="the corpus's round (a variant's `round`, 1 when absent): each round's held-out half is "
                         "written before any judged run and judged once")
    ap.add_argument("--parity", type=Path, action="append", default=[],
                    help="benchmarks/parity.py results for these variants: adds the rule 'ladder + parity' (the "
                         "L1 parity check joined to the same verdicts, as the supervisor runs it when the spec "
                         "has a [parity] table)")
    ap.add_argument("--reuse", action="store_true", help="judge the stored runs again; run nothing")
    ap.add_argument("--out", type=Path, default=None,
                    help="default: benchmarks/detection/results-<set>[-r<round>].json")
    args = ap.parse_args()
    args.out = args.out or HERE / f"results-{args.set}{'' if args.round == 1 else f'-r{args.round}'}.json"
    parity = load_parity(args.parity)
    t_start = time.time()
    started = _commit()
    programs = sorted(p.parent for p in CORPUS.glob("*/corpus.toml"))
    if args.programs:
        programs = [p for p in programs if p.name in args.programs.split(",")]
    trials: list[dict[str, Any]] = []
    for pdir in programs:
        program = tomllib.loads((pdir / "corpus.toml").read_text())
        variants = [v for v in program["variant"] if v.get("round", 1) == args.round and
                    (args.set == "all" or v.get("held_out", False) == (args.set == "held_out"))]
        ws = args.work / pdir.name
        ws.mkdir(parents=True, exist_ok=True)
        if not (ws / "reference").exists():
            (ws / "reference").symlink_to(pdir / "reference")
        spec_path = write_spec(program, ws, program["variant"])
        spec = load_spec(spec_path)
        protocol = load_spec_protocol(spec)
        print(f"{pdir.name}: {len(variants)} variants ({args.set}), baseline {args.baseline_short} short + "
              f"{args.baseline_full} full", flush=True)
        jobs = [Job(pdir.name, "reference", kind, s, pdir / "reference", ws / "runs" / "reference" / f"{kind}-s{s}")
                for kind, n in (("short", args.baseline_short), ("full", args.baseline_full)) for s in range(n)]
        jobs += [Job(pdir.name, f"v_{v['name']}", kind, s, pdir / "variants" / v["name"],
                     ws / "runs" / v["name"] / f"{kind}-s{s}")
                 for v in variants for s in range(args.trials) for kind in ("short", "full")]
        with ThreadPoolExecutor(max_workers=args.jobs) as pool:
            recs = list(pool.map(lambda j: _execute(spec_path, j, args.reuse), jobs))
        by = {(j.profile, j.kind, j.seed): r for j, r in zip(jobs, recs)}
        pool_short = [by[("reference", "short", s)] for s in range(args.baseline_short) if by.get(("reference", "short", s))]
        pool_full = [by[("reference", "full", s)] for s in range(args.baseline_full) if by.get(("reference", "full", s))]
        cases = [("reference", {"name": "reference", "kind": "faithful", "stack": "torch", "held_out": None,
                                "what": "the reference's own run at this seed, against its other seeds", "expect": []},
                  range(min(args.baseline_short, args.baseline_full)))]
        cases += [(f"v_{v['name']}", v, range(args.trials)) for v in variants]
        for profile, v, seeds in cases:
            for s in seeds:
                short, full = by.get((profile, "short", s)), by.get((profile, "full", s))
                if short is None or full is None:
                    continue
                platform = PLATFORM[v["stack"]]
                t = {"program": pdir.name, "variant": v["name"], "kind": v["kind"], "held_out": v.get("held_out"),
                     "round": v.get("round", 1),
                     "stack": v["stack"], "seed": s, "expect": v.get("expect", []), "what": v.get("what", ""),
                     "metric": {"short": short.metric, "full": full.metric}}
                port = profile != "reference"
                for rule in ("ladder", "fixed"):
                    verdict = judge_trial(short, full, pool_short, pool_full, protocol, platform, rule, s,
                                          variant=port)
                    t[rule] = verdict_record(verdict, v.get("expect", []))
                if parity:
                    outcome = parity.get((pdir.name, v["name"]))
                    sides = (outcome or {}).get("sides")
                    if sides and all(Path(sides[k], "parity.json").is_file() for k in ("reference", "target")):
                        # ladder itself with the parity check: its L1 verdict, and the L2 rules that use it
                        verdict = judge_trial(short, full, pool_short, pool_full, protocol, platform, "ladder", s,
                                              {"parity": sides}, variant=port)
                        t["parity"] = {"flagged": bool(outcome.get("flagged")), "first": outcome.get("first", "")}
                        t["ladder_parity"] = verdict_record(verdict, v.get("expect", []))
                    else:  # results of an older parity run (no side directories): the joined verdicts
                        join_parity(t, outcome)
                trials.append(t)
    report(trials, args, time.time() - t_start, started)


def _summ(trials: list[dict[str, Any]], rule: str) -> dict[str, Any]:
    ok = [t for t in trials if t["kind"] in ("faithful", "benign")]
    ref = [t for t in ok if t["variant"] == "reference"]
    ports_ok = [t for t in ok if t["variant"] != "reference"]
    faults = [t for t in trials if t["kind"] == "fault"]
    fa = sum(t[rule]["flagged"] for t in ports_ok)
    fr = sum(t[rule]["flagged"] for t in ref)
    rc = sum(t[rule]["flagged"] for t in faults)
    right = sum(t[rule]["flagged"] and t[rule]["right_check"] for t in faults)
    und = sum(t[rule]["undecided"] for t in trials)
    return {"false_alarm": [fa, len(ports_ok), interval(fa, len(ports_ok))],
            "reference_flagged": [fr, len(ref), interval(fr, len(ref))],
            "recall": [rc, len(faults), interval(rc, len(faults))],
            "recall_right_check": [right, len(faults), interval(right, len(faults))],
            "undecided": und}


def report(trials: list[dict[str, Any]], args, wall: float, started: tuple[str, bool]) -> None:
    print()
    with_parity = any("ladder_parity" in t for t in trials)
    print("| program | variant | kind | stack | set | ladder (failed checks) | fixed rule + L2 |"
          + (" parity (first tensor that differs) |" if with_parity else ""))
    print("|---|---|---|---|---|---|---|" + ("---|" if with_parity else ""))
    rows: dict[tuple, list] = {}
    for t in trials:
        rows.setdefault((t["program"], t["variant"]), []).append(t)
    for (prog, var), ts in rows.items():
        t0 = ts[0]
        cell = lambda r: (f"{sum(t[r]['flagged'] for t in ts)}/{len(ts)} "  # noqa: E731
                          + "; ".join(sorted({f.rsplit(':', 1)[0] + (' (undecided)' if f.endswith('undecided') else '')
                                              for t in ts for f in t[r]["failed"]}))[:160])
        s = "ref" if t0["held_out"] is None else ("held out" if t0["held_out"] else "dev")
        s += f" r{t0['round']}" if t0.get("round", 1) != 1 else ""
        par = ""
        if with_parity:
            p0 = t0.get("parity")
            par = (" - |" if p0 is None else f" {'flagged' if p0['flagged'] else 'passed'}"
                   f"{' (' + p0['first'] + ')' if p0['flagged'] and p0['first'] else ''} |")
        print(f"| {prog} | {var} | {t0['kind']} | {t0['stack']} | {s} | {cell('ladder')} | {cell('fixed')} |{par}")
    print()
    summary = {}
    rules = [("ladder", "ladder (calibrated + L2)"), ("fixed", "fixed rule + L2")]
    if with_parity:
        rules.append(("ladder_parity", "ladder + parity (L1 parity joined)"))
        missing = sorted({f"{t['program']}/{t['variant']}" for t in trials if "ladder_parity" in t and t["parity"] is None})
        if missing:
            print(f"- parity did not run on {len(missing)} variants (their ladder verdict stands): {', '.join(missing)}")
    for rule, label in rules:
        s = _summ(trials, rule)
        summary[rule] = s
        print(f"- {label}: false alarm on faithful/benign ports {rate(*s['false_alarm'][:2])}; the reference's other "
              f"seeds flagged {rate(*s['reference_flagged'][:2])}; fault recall {rate(*s['recall'][:2])}, with an "
              f"expected check named {rate(*s['recall_right_check'][:2])}; undecided trials {s['undecided']}")
    for prog in sorted({t["program"] for t in trials}):
        s = _summ([t for t in trials if t["program"] == prog], "ladder")
        print(f"  - {prog}: false alarm {rate(*s['false_alarm'][:2])}, recall {rate(*s['recall'][:2])}")
    # the commit the run started at (ladder's code and the corpus it judged); a commit made during a long run is
    # noted apart, never recorded as the one judged
    commit, dirty = started
    now = _commit()
    out = {"commit": commit, "dirty": dirty, **({"commit_at_end": now[0]} if now[0] != commit else {}),
           "date": datetime.datetime.now().isoformat(timespec="seconds"),
           "set": args.set, "round": args.round, "trials_per_variant": args.trials, "baseline": [args.baseline_short, args.baseline_full],
           "wall_s": round(wall, 1), "summary": summary, "trials": trials}
    args.out.write_text(json.dumps(out, indent=1))
    print(f"\nwall {wall / 60:.1f} min; commit {commit[:10]}{' (dirty)' if dirty else ''}; written {args.out}")


if __name__ == "__main__":
    main()
