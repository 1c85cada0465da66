"""The prepare step: a profile's `prepare` commands (data download, tokenisation) run once per source digest.

The commands run in a scratch copy of the source, with the profile's interpreter, environment, secret
scrub and sandbox, exactly as runs are; they may write only that scratch copy. The files they create or
change there are the prepared data: they move to `$LADDER_CACHE/prepared/<key>/out/`, keyed by the
commands, the working directory, the profile's environment and vars, the interpreter and the digest of
the source files (all of them, or those `prepare_inputs` names). A marker written last makes a prepare
cut off by a crash or a kill look unbuilt, so the next run prepares again; a lock lets two runs wait for
one prepare. Every run then sees the data read-only: at the same relative paths in its copy of the
source (links into the cache, which the sandbox mounts read-only) and under `{prepared}` /
`$LADDER_PREPARED` (the same tree; during the prepare step it names the scratch copy).

Must not: write outside its own cache directory, or hand a run a writable path into the prepared data.
"""

from __future__ import annotations

import collections
import fcntl
import fnmatch
import hashlib
import json
import os
import shlex
import shutil
import stat
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ladder._util.errors import LadderError
from ladder.migration.spec import Profile, Spec, fill_command
from ladder.runs.envs import cache_root

READY = ".ladder-ready"
Progress = Callable[[str, dict], None]


@dataclass(frozen=True)
class Prepared:
    """A profile's prepared data in the cache: `out` holds the files at their paths in the source."""

    key: str
    out: Path
    paths: tuple[str, ...]  # what a run's copy links: new directories as a whole, else single files
    built_now: bool = False


def _ignore(profile: Profile) -> Callable[[str, list[str]], set[str]]:
    from ladder.runs.execute import COPY_IGNORE_PATTERNS

    return shutil.ignore_patterns(*COPY_IGNORE_PATTERNS, *profile.copy_ignore)


def source_digest(source: Path, profile: Profile) -> str:
    """sha256 over the source files a run's copy holds (the same ignore rules), or those `prepare_inputs`
    names (fnmatch patterns on paths relative to the source, `*` crossing directories)."""
    h = hashlib.sha256()
    ignore = _ignore(profile)
    for dirpath, dirnames, filenames in os.walk(source):
        skipped = ignore(dirpath, dirnames + filenames)
        dirnames[:] = sorted(d for d in dirnames if d not in skipped)
        for name in sorted(f for f in filenames if f not in skipped):
            path = Path(dirpath) / name
            rel = path.relative_to(source).as_posix()
            if profile.prepare_inputs and not any(fnmatch.fnmatch(rel, g) for g in profile.prepare_inputs):
                continue
            h.update(rel.encode() + b"\0")
            h.update(os.readlink(path).encode() if path.is_symlink() else _file_sha(path))
    return h.hexdigest()


def _file_sha(path: Path) -> bytes:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.digest()


def prepare_key(spec: Spec, profile_name: str, python: str, digest: str) -> str:
    profile = spec.profile(profile_name)
    vars_ = {**spec.experiment.vars, **profile.vars}
    blob = json.dumps({"prepare": profile.prepare, "cwd": profile.cwd, "env": profile.env, "vars": vars_,
                       "python": python, "source": digest}, sort_keys=True)
    return hashlib.sha256(blob.encode()).hexdigest()[:16]


def _snapshot(root: Path) -> dict[str, tuple[int, int]]:
    out = {}
    for p in root.rglob("*"):
        if p.is_symlink() or p.is_file():
            st = p.lstat()
            out[p.relative_to(root).as_posix()] = (st.st_size, st.st_mtime_ns)
    return out


def _link_roots(outputs: list[str], before: dict[str, tuple[int, int]]) -> list[str]:
    """The fewest paths that cover the outputs: a directory the prepare step created is linked whole."""
    existing_dirs = {p.as_posix() for rel in before for p in Path(rel).parents}
    roots: set[str] = set()
    for rel in outputs:
        top = rel
        for parent in reversed(Path(rel).parents):  # from the outermost directory inwards
            if parent.as_posix() != "." and parent.as_posix() not in existing_dirs:
                top = parent.as_posix()
                break
        roots.add(top)
    return sorted(roots)


def ensure_prepared(spec: Spec, profile_name: str, source: Path, python: str,
                    progress: Progress | None = None) -> Prepared | None:
    """Run the profile's prepare commands for this source once (cached), and return where their output is."""
    profile = spec.profile(profile_name)
    if not profile.prepare:
        return None
    key = prepare_key(spec, profile_name, python, source_digest(source, profile))
    root = cache_root() / "prepared"
    root.mkdir(parents=True, exist_ok=True)
    entry = root / key
    with open(root / f"{key}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = entry / READY
        if marker.exists():
            return Prepared(key, entry / "out", tuple(json.loads(marker.read_text())["paths"]))
        if entry.exists():
            _make_writable(entry)
            shutil.rmtree(entry)
        paths = _build(spec, profile_name, source, python, entry, progress)
        marker.write_text(json.dumps({"paths": paths, "commands": profile.prepare, "built_at": time.time()}))
        return Prepared(key, entry / "out", tuple(paths), built_now=True)


def _build(spec: Spec, profile_name: str, source: Path, python: str, entry: Path,
           progress: Progress | None) -> list[str]:
    from ladder.runs.execute import copy_source
    from ladder.runs.runner import RunRequest, get_runner
    from ladder.runs.runner.sandbox import interpreter_paths
    from ladder.runs.runner.sandbox import resolve as resolve_sandbox
    from ladder.runs.runner.scrub import scrubbed_env

    profile = spec.profile(profile_name)
    work, out = entry / "work", entry / "out"
    mounts = [spec.resolve_path(m) for m in profile.mounts]
    copy_source(source, work, profile.copy_ignore, mounts)
    cwd = work / profile.cwd
    if not cwd.is_dir():
        raise LadderError(f"profile {profile_name!r}: cwd {profile.cwd!r} is not a directory of the source",
                          "fix the profile's `cwd` (a directory inside the source)")
    before = _snapshot(work)
    sandbox, _ = resolve_sandbox(profile.sandbox)
    env, _ = scrubbed_env(dict(os.environ), profile.pass_env)
    env.update(profile.env)
    env.update({"PYTHONUNBUFFERED": "1", "LADDER_PREPARED": str(work)})
    read_only = [*interpreter_paths(python), cache_root() / "envs", *mounts]
    values = {**spec.experiment.vars, **profile.vars, "python": shlex.quote(python), "prepared": shlex.quote(str(work))}
    runner = get_runner(profile.runner)
    for i, template in enumerate(profile.prepare, 1):
        command = fill_command(template, values)
        if progress:
            progress("env", {"message": f"prepare {profile_name} [{i}/{len(profile.prepare)}] {command}"})
        tail: collections.deque[str] = collections.deque(maxlen=30)
        log_dir = entry / f"log-{i}"
        outcome = runner.execute(RunRequest(argv=command, cwd=cwd, env=env, log_dir=log_dir,
                                            timeout_s=profile.prepare_timeout_minutes * 60, sandbox=sandbox,
                                            read_only=tuple(read_only), writable=(work,)),
                                 lambda stream, line, t: tail.append(line))
        if outcome.exit_code != 0:
            why = "timed out" if outcome.timed_out else f"exit {outcome.exit_code}"
            raise LadderError(f"profile {profile_name!r}: prepare command {i} failed ({why}): {command}\n"
                              + "\n".join(tail),
                              f"fix the profile's `prepare` commands (or prepare_timeout_minutes); logs: {log_dir}")
    after = _snapshot(work)
    outputs = sorted(rel for rel, sig in after.items() if before.get(rel) != sig)
    if not outputs:
        raise LadderError(f"profile {profile_name!r}: the prepare commands created or changed no file",
                          "write the prepared data into the source tree (e.g. data/) or under $LADDER_PREPARED")
    for rel in outputs:
        dst = out / rel
        dst.parent.mkdir(parents=True, exist_ok=True)
        os.replace(work / rel, dst)
        if not dst.is_symlink():
            dst.chmod(dst.stat().st_mode & ~(stat.S_IWUSR | stat.S_IWGRP | stat.S_IWOTH))
    shutil.rmtree(work)
    return _link_roots(outputs, before)


def _make_writable(root: Path) -> None:
    for p in root.rglob("*"):
        if not p.is_symlink():
            p.chmod(p.stat().st_mode | stat.S_IWUSR)


def link_prepared(prepared: Prepared, work: Path) -> list[str]:
    """Show the prepared data to a run at its paths in the run's copy (read-only links into the cache)."""
    for rel in prepared.paths:
        link = work / rel
        if link.is_symlink() or link.is_file():
            link.unlink()
        elif link.is_dir():
            shutil.rmtree(link)
        link.parent.mkdir(parents=True, exist_ok=True)
        link.symlink_to(prepared.out / rel)
    return list(prepared.paths)
