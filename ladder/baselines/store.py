"""Reference baselines: stored once, immutable, verifiable.

Layout: `baselines/<name>/v<N>/` holds `baseline.json`, one directory per run (`short-s<seed>/`,
`full-s<seed>/`) and `MANIFEST.sha256` over all of it. A version is built in `.v<N>.partial/` and
renamed when complete, so a crash leaves no half baseline; completed runs in a partial directory are
reused by the next attempt. A new version is written only with `force`.
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
from ladder._util.hashing import manifest_digest, sha256_file, verify_manifest, write_manifest
from ladder.runs.records import RunRecord
from ladder.migration.spec import Spec

BASELINE_SCHEMA = 1
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


def create_baseline(spec: Spec, seeds: int = 1, full_seeds: int = 1, short_only: bool = False,
                    force: bool = False, progress: Progress | None = None,
                    profile: str = "reference") -> Baseline:
    """Run the reference short run per seed and the full run(s); store them as a new version."""
    from ladder.runs.execute import execute_run

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
    done: dict[str, RunRecord] = {}
    for i, (kind, seed) in enumerate(plan, 1):
        name = f"{kind}-s{seed}"
        run_dir = partial / name
        prior = _run_ok(run_dir) if run_dir.exists() else None
        if prior is not None:
            done[name] = prior
            if progress:
                progress("reuse", {"run": name, "index": i, "total": len(plan)})
            continue
        if run_dir.exists():
            shutil.rmtree(run_dir)
        if progress:
            progress("baseline_run", {"run": name, "index": i, "total": len(plan)})
        record = execute_run(spec, profile, kind, seed, run_dir=run_dir, progress=progress)
        shutil.rmtree(run_dir / "work", ignore_errors=True)
        if record.exit_code != 0 or record.metric is None or record.timed_out:
            why = ("timed out" if record.timed_out else f"exit code {record.exit_code}" if record.exit_code
                   else "no headline metric in its output")
            raise LadderError(
                f"reference run {name} failed ({why}); the baseline was not stored. Last lines:\n  "
                + "\n  ".join(record.last_lines[-8:]),
                f"fix the reference command or [parse] patterns; the run is kept in {run_dir}",
            )
        done[name] = record
    meta = BaselineMeta(
        name=spec.name, version=version, created_at=time.time(), profile=profile,
        platform=spec.profile(profile).platform, seeds=seed_list, full_seeds=full_list,
        short_runs=[f"short-s{s}" for s in seed_list], full_runs=[f"full-s{s}" for s in full_list],
        spec_sha256=sha256_file(spec.path) if spec.path else "", protocol=spec.protocol,
    )
    (partial / "baseline.json").write_text(meta.model_dump_json(indent=1))
    if spec.path:
        shutil.copy2(spec.path, partial / "ladder.toml")
    write_manifest(partial)
    final = spec.baselines_dir / f"v{version}"
    partial.rename(final)
    return Baseline.load(final)


def verify_baseline(root: Path) -> list[str]:
    """Problems with a stored baseline version (empty = intact)."""
    return verify_manifest(root)


def require_intact(baseline: Baseline) -> None:
    problems = verify_baseline(baseline.root)
    if problems:
        raise IntegrityError(f"baseline {baseline.root} was modified after it was stored: " + "; ".join(problems),
                             "restore it from version control, or write a new one with `ladder baseline --force`")
