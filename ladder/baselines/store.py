"""Reference baselines: stored once, immutable, verifiable, extensible only by appending.

Layout: `baselines/<name>/v<N>/` holds `baseline.json`, one directory per run (`short-s<seed>/`,
`full-s<seed>/`) and `MANIFEST.sha256` over all of it. A version is built in `.v<N>.partial/` and
renamed when complete, so a crash leaves no half baseline; completed runs in a partial directory are
reused by the next attempt. A new version is written only with `force`.

Extending a version (`extend`: more seeds for a calibrated verdict) adds run directories and never
changes one: the previous `MANIFEST.sha256` and `baseline.json` move to `history/` (as
`MANIFEST.<k>.sha256`, `baseline.<k>.json`), and the new manifest covers them too, so every earlier
digest stays provable: `verify_baseline` checks that each history manifest's files are still there,
unchanged, and `manifest_chain` gives every digest the version ever had (the journal's pins).
"""

from __future__ import annotations

import json
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from pydantic import BaseModel, Field

from ladder._util.errors import IntegrityError, LadderError
from ladder._util.hashing import manifest_digest, sha256_file, tree_hashes, verify_manifest, write_manifest
from ladder.runs.records import RunRecord
from ladder.migration.spec import Spec

BASELINE_SCHEMA = 1
HISTORY = "history"
Progress = Callable[[str, dict], None]


class BaselineMeta(BaseModel):
    schema_version: int = BASELINE_SCHEMA
    name: str
    version: int
    created_at: float
    profile: str
    platform: str
    seeds: list[int]
    full_seeds: list[int]
    short_runs: list[str] = Field(default_factory=list)
    full_runs: list[str] = Field(default_factory=list)
    spec_sha256: str
    protocol: str
    identical_runs: bool = False  # the short runs came out bit-identical: no noise estimate
    extensions: list[dict] = Field(default_factory=list)  # {at, added, previous_manifest}


@dataclass
class Baseline:
    root: Path
    meta: BaselineMeta
    short_runs: list[RunRecord]
    full_runs: list[RunRecord]

    @property
    def digest(self) -> str:
        return manifest_digest(self.root)

    def reference(self, kind: str, seed: int | None = None) -> RunRecord | None:
        runs = self.short_runs if kind == "short" else self.full_runs
        for r in runs:
            if r.seed == seed:
                return r
        return runs[0] if runs else None

    @classmethod
    def load(cls, root: Path) -> "Baseline":
        path = root / "baseline.json"
        if not path.exists():
            raise LadderError(f"{root} is not a baseline (no baseline.json)", "run `ladder baseline` first")
        data = json.loads(path.read_text())
        if data.get("schema_version") != BASELINE_SCHEMA:
            raise LadderError(f"{path}: baseline schema {data.get('schema_version')!r} is not {BASELINE_SCHEMA}",
                              "re-create the baseline with this ladder version (--force)")
        meta = BaselineMeta.model_validate(data)
        return cls(root, meta, [RunRecord.load(root / d) for d in meta.short_runs],
                   [RunRecord.load(root / d) for d in meta.full_runs])


def versions(spec_or_dir: Spec | Path) -> list[Path]:
    base = spec_or_dir.baselines_dir if isinstance(spec_or_dir, Spec) else spec_or_dir
    if not base.is_dir():
        return []
    found = [p for p in base.iterdir() if p.is_dir() and p.name.startswith("v") and p.name[1:].isdigit()]
    return sorted(found, key=lambda p: int(p.name[1:]))


def latest(spec: Spec) -> Baseline | None:
    vs = versions(spec)
    return Baseline.load(vs[-1]) if vs else None


def resolve_baseline(spec: Spec | None, path: Path | None) -> Baseline | None:
    """A baseline given by path (a version dir or a baselines/<name> dir), else the spec's latest."""
    if path is not None:
        path = Path(path)
        if (path / "baseline.json").exists():
            return Baseline.load(path)
        vs = versions(path)
        if not vs:
            raise LadderError(f"no baseline under {path}", "pass a baselines/<name>/v<N> directory")
        return Baseline.load(vs[-1])
    return latest(spec) if spec is not None else None


def _run_ok(run_dir: Path) -> RunRecord | None:
    try:
        r = RunRecord.load(run_dir)
    except LadderError:
        return None
    return r if r.ended_at is not None and r.exit_code == 0 and r.metric is not None else None


DEFAULT_SEEDS, DEFAULT_FULL_SEEDS = 5, 3  # enough for calibrated verdicts on the short and the full run


def _execute_into(spec: Spec, profile: str, plan: list[tuple[str, int]], partial: Path,
                  progress: Progress | None) -> dict[str, RunRecord]:
    """Run each (kind, seed) of the plan into partial/<kind>-s<seed>, reusing completed ones; the profile's
    `parallel` runs at a time (seeds are independent: one per accelerator of a multi-GPU machine)."""
    import threading
    from concurrent.futures import ThreadPoolExecutor

    from ladder.runs.execute import execute_run

    done: dict[str, RunRecord] = {}
    todo: list[tuple[int, str, int]] = []
    for i, (kind, seed) in enumerate(plan, 1):
        name = f"{kind}-s{seed}"
        run_dir = partial / name
        prior = _run_ok(run_dir) if run_dir.exists() else None
        if prior is not None:
            done[name] = prior
            if progress:
                progress("reuse", {"run": name, "index": i, "total": len(plan), "profile": profile, "kind": kind,
                                   "seed": seed})
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)
        todo.append((i, kind, seed))
    parallel = spec.profile(profile).parallel
    lock = threading.Lock()
    said = (lambda ev, data: _locked(lock, progress, ev, data)) if progress else None
    free = list(range(parallel))

    def one(i: int, kind: str, seed: int) -> RunRecord:
        with lock:
            slot = free.pop(0)
        try:
            if said:
                said("baseline_run", {"run": f"{kind}-s{seed}", "index": i, "total": len(plan), "profile": profile,
                                      "kind": kind, "seed": seed})
            return execute_run(spec, profile, kind, seed, run_dir=partial / f"{kind}-s{seed}", progress=said,
                               slot=slot if parallel > 1 else None)
        finally:
            with lock:
                free.append(slot)
            shutil.rmtree(partial / f"{kind}-s{seed}" / "work", ignore_errors=True)

    if parallel == 1:  # in this thread: Ctrl-C reaches the runner, which takes the run down at once
        results = [(f"{kind}-s{seed}", lambda i=i, kind=kind, seed=seed: one(i, kind, seed)) for i, kind, seed in todo]
        records = ((name, run()) for name, run in results)
    else:
        pool = ThreadPoolExecutor(max_workers=parallel)
        futures = [(f"{kind}-s{seed}", pool.submit(one, i, kind, seed)) for i, kind, seed in todo]
        records = ((name, fut.result()) for name, fut in futures)
        pool.shutdown(wait=False)  # the generator below waits on each; a failure leaves no new start queued
    for name, record in records:
        if record.exit_code != 0 or record.metric is None or record.timed_out or record.infrastructure:
            why = (f"the infrastructure failed ({record.infrastructure.kind}: {record.infrastructure.detail})"
                   if record.infrastructure else "timed out" if record.timed_out
                   else f"exit code {record.exit_code}" if record.exit_code else "no headline metric in its output")
            raise LadderError(
                f"reference run {name} failed ({why}); the baseline was not stored. Last lines:\n  "
                + "\n  ".join(record.last_lines[-8:]),
                f"fix the reference command or [parse] patterns; the run is kept in {partial / name}",
            )
        done[name] = record
    return done


def _locked(lock, progress: Progress, ev: str, data: dict) -> None:  # type: ignore[no-untyped-def]
    with lock:
        progress(ev, data)


def create_baseline(spec: Spec, seeds: int = DEFAULT_SEEDS, full_seeds: int = DEFAULT_FULL_SEEDS, short_only: bool = False,
                    force: bool = False, progress: Progress | None = None,
                    profile: str = "reference") -> Baseline:
    """Run the reference short run per seed and the full run(s); store them as a new version."""
    if seeds < 1 or full_seeds < 0:
        raise LadderError(f"seeds={seeds}, full_seeds={full_seeds}", "use --seeds >= 1")
    existing = versions(spec)
    if existing and not force:
        raise LadderError(
            f"a baseline already exists at {existing[-1]}; baselines are immutable",
            "use it as it is, or pass --force to write a new version beside it",
        )
    version = (int(existing[-1].name[1:]) + 1) if existing else 1
    partial = spec.baselines_dir / f".v{version}.partial"
    partial.mkdir(parents=True, exist_ok=True)
    seed_list = list(range(seeds))
    full_list = [] if short_only else list(range(full_seeds))
    plan = [("short", s) for s in seed_list] + [("full", s) for s in full_list]
    done = _execute_into(spec, profile, plan, partial, progress)
    meta = BaselineMeta(
        name=spec.name, version=version, created_at=time.time(), profile=profile,
        platform=spec.profile(profile).platform, seeds=seed_list, full_seeds=full_list,
        short_runs=[f"short-s{s}" for s in seed_list], full_runs=[f"full-s{s}" for s in full_list],
        spec_sha256=sha256_file(spec.path) if spec.path else "", protocol=spec.protocol,
        identical_runs=_identical([done[f"short-s{s}"] for s in seed_list]),
    )
    (partial / "baseline.json").write_text(meta.model_dump_json(indent=1))
    if spec.path:
        shutil.copy2(spec.path, partial / "ladder.toml")
    write_manifest(partial)
    final = spec.baselines_dir / f"v{version}"
    partial.rename(final)
    return Baseline.load(final)


def _identical(runs: list[RunRecord]) -> bool:
    from ladder.checks.stats import identical_runs

    return identical_runs(runs)


def extend_baseline(spec: Spec, root: Path, seeds: int, full_seeds: int | None = None,
                    progress: Progress | None = None) -> Baseline:
    """Bring a stored version to `seeds` short runs (and `full_seeds` full runs) by adding runs; nothing that
    is stored changes (see the module docstring). New runs are built in `.v<N>.extend.partial/` first."""
    b = Baseline.load(root)
    require_intact(b)
    have_short, have_full = list(b.meta.seeds), list(b.meta.full_seeds)
    want_full = len(have_full) if full_seeds is None else full_seeds
    if seeds < len(have_short) or want_full < len(have_full):
        raise LadderError(f"{root} already holds {len(have_short)} short and {len(have_full)} full runs",
                          "extend only adds runs: ask for at least as many as it holds")
    add_short = list(range(max(have_short, default=-1) + 1, max(have_short, default=-1) + 1 + seeds - len(have_short)))
    add_full = list(range(max(have_full, default=-1) + 1, max(have_full, default=-1) + 1 + want_full - len(have_full)))
    plan = [("short", s) for s in add_short] + [("full", s) for s in add_full]
    if not plan:
        return b
    partial = root.parent / f".{root.name}.extend.partial"
    partial.mkdir(parents=True, exist_ok=True)
    _execute_into(spec, b.meta.profile, plan, partial, progress)
    previous = manifest_digest(root)
    history = root / HISTORY
    history.mkdir(exist_ok=True)
    k = len(list(history.glob("MANIFEST.*.sha256"))) + 1
    for kind, seed in plan:  # whole run directories, each with its own manifest, moved in
        (partial / f"{kind}-s{seed}").rename(root / f"{kind}-s{seed}")
    shutil.copy2(root / "baseline.json", history / f"baseline.{k}.json")
    (root / "MANIFEST.sha256").replace(history / f"MANIFEST.{k}.sha256")
    meta = b.meta.model_copy(update={
        "seeds": have_short + add_short, "full_seeds": have_full + add_full,
        "short_runs": b.meta.short_runs + [f"short-s{s}" for s in add_short],
        "full_runs": b.meta.full_runs + [f"full-s{s}" for s in add_full],
        "extensions": b.meta.extensions + [{"at": time.time(), "added": [f"{kd}-s{s}" for kd, s in plan],
                                            "previous_manifest": previous}]})
    meta = meta.model_copy(update={"identical_runs": _identical(
        [RunRecord.load(root / d) for d in meta.short_runs])})
    tmp = root / "baseline.json.tmp"
    tmp.write_text(meta.model_dump_json(indent=1))
    tmp.replace(root / "baseline.json")
    write_manifest(root)
    shutil.rmtree(partial, ignore_errors=True)
    return Baseline.load(root)


def manifest_chain(root: Path) -> list[str]:
    """Every digest this version's manifest ever had, oldest first (the current one last)."""
    history = root / HISTORY
    old = sorted(history.glob("MANIFEST.*.sha256"), key=lambda p: int(p.name.split(".")[1])) if history.is_dir() else []
    out = [sha256_file(p) for p in old]
    if (root / "MANIFEST.sha256").exists():
        out.append(manifest_digest(root))
    return out


def verify_baseline(root: Path) -> list[str]:
    """Problems with a stored baseline version (empty = intact): the current manifest, and every earlier
    manifest of an extended version (its files still there and unchanged; baseline.json as kept in history)."""
    problems = verify_manifest(root)
    history = root / HISTORY
    if not history.is_dir():
        return problems
    current = tree_hashes(root)
    for old in sorted(history.glob("MANIFEST.*.sha256"), key=lambda p: int(p.name.split(".")[1])):
        k = old.name.split(".")[1]
        listed = {}
        for line in old.read_text().splitlines():
            if line.strip():
                h, name = line.split("  ", 1)
                listed[name] = h
        for name, h in listed.items():
            actual = current.get(f"{HISTORY}/baseline.{k}.json") if name == "baseline.json" else current.get(name)
            if actual != h:
                problems.append(f"history {old.name}: {name} is not what that manifest recorded")
    return problems


def pinned(spec: Spec, journal_path: Path | None = None) -> tuple[Baseline | None, str | None]:
    """The baseline version a migration pinned in its journal (its last `baseline` entry), and a note when a
    newer version exists beside it (ignored). Without a journal entry: the latest version, no note."""
    from ladder.journal.store import Journal

    journal_path = journal_path or spec.journal_dir / "journal.sqlite"
    entry = None
    if journal_path.is_file():
        with Journal(journal_path) as j:
            entry = j.last("baseline")
    vs = versions(spec)
    if entry is None:
        return (Baseline.load(vs[-1]) if vs else None), None
    root = Path(entry.content["path"])
    root = root if root.is_absolute() else spec.workspace / root
    if not (root / "baseline.json").exists():
        raise LadderError(f"the migration's pinned baseline {root} is missing",
                          "restore it from a trusted copy; a different baseline would change every verdict")
    b = Baseline.load(root)
    if entry.content.get("digest") not in manifest_chain(root):
        raise IntegrityError(f"the pinned baseline {root} does not match the digest recorded in the journal",
                             "restore it from a trusted copy")
    newer = [v for v in vs if int(v.name[1:]) > b.meta.version]
    note = (f"{', '.join(v.name for v in newer)} exist(s) beside the pinned {root.name} and are ignored: a migration "
            "keeps the baseline it started with") if newer else None
    return b, note


def require_intact(baseline: Baseline) -> None:
    problems = verify_baseline(baseline.root)
    if problems:
        raise IntegrityError(f"baseline {baseline.root} was modified after it was stored: " + "; ".join(problems),
                             "restore it from version control, or write a new one with `ladder baseline --force`")
