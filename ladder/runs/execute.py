"""Execute one captured run of a spec's experiment on a profile, and record it as run.json.

Owns the run directory layout:
  runs/<name>/<run_id>/run.json        the RunRecord (written at start, rewritten at the end)
                       stdout.log      timestamped output, stderr.log likewise
                       probe/          the probe's per-process reports
                       work/           the copy of the code under test the run executes in
                       MANIFEST.sha256 hashes of everything but work/
"""

from __future__ import annotations

import math
import os
import re
import shlex
import shutil
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from ladder._util.errors import LadderError
from ladder._util.hashing import write_manifest
from ladder.runs.envs import Environment, ensure_env, package_list, resolve_interpreter
from ladder.runs.parse import OutputParser
from ladder.migration.protocol import Protocol
from ladder.runs.provenance import provenance
from ladder.runs.records import InfrastructureFailure, RunRecord
from ladder.runs.runner import LineSink, RunRequest, get_runner
from ladder.runs.runner.sandbox import resolve as resolve_sandbox
from ladder.runs.runner.scrub import scrubbed_env
from ladder.migration.spec import Profile, Spec, fill_command, load_spec_protocol

# (event, data): "env", "start", "loss", "end", "warning", and ladder.runs.envs's "env_*" while a setup builds;
# execute_run adds the run's "profile", "kind" and "seed" to each, so that a display can say whose it is
Progress = Callable[[str, dict], None]
COPY_IGNORE_PATTERNS = (".git", "runs", "baselines", "journals", "__pycache__", "*.pyc", ".ladder*", "ladder.toml")


@dataclass(frozen=True)
class RunPlan:
    spec: Spec
    profile_name: str
    kind: str
    seed: int
    source: Path
    run_dir: Path
    timeout_s: float


def profile_environment(profile: Profile, progress: Progress | None = None, name: str = "") -> Environment:
    if profile.setup:
        return ensure_env(profile.setup, profile.python or "{env}/bin/python", progress, name)
    return Environment(resolve_interpreter(profile.python), None)


def timeout_for(spec: Spec, protocol: Protocol, kind: str) -> float:
    minutes = spec.timeout_minutes or protocol.timeout.factor * spec.expected_minutes(kind)
    return minutes * 60.0


def new_run_dir(spec: Spec, profile: str, kind: str, seed: int, parent: Path | None = None) -> Path:
    parent = parent or spec.runs_dir
    stamp = time.strftime("%Y%m%d-%H%M%S")
    base = parent / f"{profile}-{kind}-s{seed}-{stamp}"
    path, n = base, 1
    while path.exists():
        n += 1
        path = Path(f"{base}-{n}")
    path.mkdir(parents=True)
    return path


def copy_source(source: Path, dst: Path, ignore: list[str], mounts: list[Path]) -> list[str]:
    """Copy the code under test for one run. Symbolic links that stay inside the source stay valid in the
    copy (relative, pointing into the copy); a link that leaves it is kept only when its target lies in a
    directory the profile mounts (read-only in the sandbox); any other is refused: a run must not write
    outside its copy through a link, nor depend on files the spec does not name."""
    if dst.exists():
        shutil.rmtree(dst)
    shutil.copytree(source, dst, ignore=shutil.ignore_patterns(*COPY_IGNORE_PATTERNS, *ignore), symlinks=True)
    src_root = source.resolve()
    bad, notes = [], []
    for link in [p for p in dst.rglob("*") if p.is_symlink()]:
        rel = link.relative_to(dst)
        original = source / rel
        target = Path(os.readlink(link))
        resolved = (original.parent / target).resolve() if not target.is_absolute() else target.resolve()
        link.unlink()
        if resolved == src_root or src_root in resolved.parents:
            inside = dst / resolved.relative_to(src_root)
            link.symlink_to(os.path.relpath(inside, link.parent))
        elif any(resolved == m or m in resolved.parents for m in mounts):
            link.symlink_to(resolved)
            notes.append(f"{rel} -> {resolved} (a mounted directory, read-only)")
        else:
            bad.append(f"{rel} -> {target}")
    if bad:
        raise LadderError(f"the source has links that leave it: {', '.join(bad[:5])}",
                          "add the directories they point to to the profile's `mounts` (read-only for the run), "
                          "or copy the files into the repository")
    return notes


def _command(spec: Spec, profile_name: str, kind: str, seed: int, python: str, run_dir: Path,
             prepared: Path | None = None, template: str | None = None) -> str:
    profile = spec.profile(profile_name)
    values = {**spec.experiment.vars, **profile.vars, "python": shlex.quote(python), "seed": str(seed),
              "steps": str(spec.steps(kind)), "run_dir": shlex.quote(str(run_dir))}
    if prepared is not None:
        values["prepared"] = shlex.quote(str(prepared))
    try:
        return fill_command(template or spec.command(kind, profile_name), values)
    except (KeyError, IndexError, ValueError) as e:
        raise LadderError(f"cannot fill the {kind} command's placeholders: {e}",
                          "define every {placeholder} in [experiment.vars] or the profile's vars")


def _pattern_notes(parser: OutputParser) -> list[str]:
    notes = []
    if parser.line_count and parser.loss_lines == 0:
        notes.append("the loss pattern matched no line: see first_lines and fix [parse].loss")
    if parser.line_count and parser.metric_raw is None:
        notes.append("the metric pattern matched no line: see last_lines and fix [parse].metric")
    elif parser.metric_raw is not None and parser.metric is None:
        notes.append(f"the metric pattern matched but {parser.metric_raw!r} is not a number")
    return notes


def collect_export(spec: Spec, kind: str, cwd: Path, run_dir: Path) -> list[str]:
    """A full run's exported weights ([parity].export, written in its working directory) move into the run
    directory, where the manifest seals them and the copy of the code can be deleted."""
    name = spec.parity.export if spec.parity else None
    if kind != "full" or not name or cwd == run_dir:
        return []
    src, dst = (cwd / name).resolve(), (run_dir / Path(name).name)
    if cwd.resolve() not in src.parents or not src.is_file():
        return [f"the full run wrote no {name} ([parity].export) in its working directory"]
    shutil.move(str(src), str(dst))
    return [f"exported weights kept: {dst.name}"]


def run_vars(run_dir: str, seed: int, slot: int | None) -> dict[str, str]:
    """The variables ladder sets in every run, wherever it runs."""
    out = {"PYTHONUNBUFFERED": "1", "LADDER_RUN_DIR": run_dir, "LADDER_SEED": str(seed)}
    return out if slot is None else {**out, "LADDER_SLOT": str(slot)}


def execute_run(spec: Spec, profile_name: str, kind: str, seed: int = 0, source: Path | None = None,
                run_dir: Path | None = None, progress: Progress | None = None,
                timeout_s: float | None = None, command: str | None = None,
                environment: Environment | None = None, slot: int | None = None, probe: bool = True) -> RunRecord:
    """Run the experiment once and return its record (also saved as run_dir/run.json).

    `command` replaces the spec's command of that kind (a parity side, ladder.parity); `environment`
    replaces the profile's (a fresh re-run built from the port's own setup file, ladder.grade); `slot`
    (0..parallel-1) tells a run started beside others which accelerator is its own (LADDER_SLOT). `probe=False`
    runs the program alone, everything else as usual: what the probe costs and whether it changes the program
    (benchmarks/gpu); such a run has no device facts, so L2 cannot be judged on it."""
    from ladder.runs.probe_report import merge_reports, probe_env

    if kind not in ("short", "full") and command is None:
        raise LadderError(f"unknown run kind {kind!r}", "use --kind short or --kind full")
    progress = tagged(progress, {"profile": profile_name, "kind": kind, "seed": seed})
    profile = spec.profile(profile_name)
    if profile.runner != "local":  # the same contract, kept on another machine
        from ladder.runs.remote.execute import execute_remote_run

        if environment is not None:
            raise LadderError(f"profile {profile_name!r} runs on {profile.runner}: a fresh environment is built "
                              "on this machine only", "grade with a local profile")
        return execute_remote_run(spec, profile_name, kind, seed, source, run_dir, progress, timeout_s, slot,
                                  command)
    protocol = load_spec_protocol(spec)
    source = (source or spec.source_dir).resolve()
    if not source.is_dir():
        raise LadderError(f"source {source} is not a directory", "pass --source DIR of a checkout")
    env_info = environment or profile_environment(profile, progress, profile_name)
    from ladder.runs.prepare import ensure_prepared, link_prepared

    prepared = ensure_prepared(spec, profile_name, source, env_info.python, progress)
    from ladder.migration.workspace import changes, protected_state

    guarded = protected_state(spec)
    sandbox, sandbox_warning = resolve_sandbox(profile.sandbox)
    mounts = [spec.resolve_path(m) for m in profile.mounts]
    missing = [str(m) for m in mounts if not m.exists()]
    if missing:
        raise LadderError(f"the profile mounts {', '.join(missing)}, which do not exist",
                          "fix the profile's `mounts` (paths relative to ladder.toml, or absolute)")
    run_dir = (run_dir or new_run_dir(spec, profile_name, kind, seed)).resolve()
    run_dir.mkdir(parents=True, exist_ok=True)
    link_notes: list[str] = []
    if profile.workdir == "copy":
        root = run_dir / "work"
        link_notes = copy_source(source, root, profile.copy_ignore, mounts)
        if prepared is not None:
            link_notes += [f"{p} -> the prepared data (read-only)" for p in link_prepared(prepared, root)]
    else:
        root = source
    cwd = root / profile.cwd
    if not cwd.is_dir():
        raise LadderError(f"profile {profile_name!r}: cwd {profile.cwd!r} is not a directory of {source}",
                          "fix the profile's `cwd` (a directory inside the source)")
    command = _command(spec, profile_name, kind, seed, env_info.python, run_dir,
                       prepared.out if prepared is not None else None, command)

    packages: list[str] = []
    freezer = threading.Thread(target=lambda: packages.extend(package_list(env_info.python)), daemon=True)
    freezer.start()

    env, removed = scrubbed_env(dict(os.environ), profile.pass_env)
    env.update(profile.env)
    if env.get("PYTHONPATH"):
        # `PYTHONPATH=. ladder run` meant the caller's directory, not the run's own copy: made absolute, so
        # that the sandbox can mount it and the run imports what the caller meant
        env["PYTHONPATH"] = os.pathsep.join(str(Path(p).absolute()) if p else p
                                            for p in env["PYTHONPATH"].split(os.pathsep))
    timeout = timeout_s if timeout_s is not None else timeout_for(spec, protocol, kind)
    from ladder.runs.probe_report import PROBE_DIR
    from ladder.runs.envs import cache_root
    from ladder.runs.runner.sandbox import interpreter_paths

    read_only = [*interpreter_paths(env_info.python), PROBE_DIR, cache_root() / "envs", *mounts]
    read_only += [prepared.out] if prepared is not None else []
    read_only += [Path(p) for p in env.get("PYTHONPATH", "").split(os.pathsep) if p]
    writable = [run_dir] + ([root] if profile.workdir == "inplace" else [])
    from ladder.runs.integrity import allowed_roots

    if probe:
        probe_opts = {**spec.probe_options(profile).model_dump(), "roots": allowed_roots(read_only, writable)}
        env.update(probe_env(run_dir / "probe", probe_opts, pythonpath=env.get("PYTHONPATH", "")))
    env.update(run_vars(str(run_dir), seed, slot))
    if prepared is not None:
        env["LADDER_PREPARED"] = str(prepared.out)

    parse = spec.parse_for(profile_name)
    parser = OutputParser(parse)
    record = RunRecord(
        run_id=run_dir.name, kind=kind, profile=profile_name, platform=profile.platform, seed=seed,  # type: ignore[arg-type]
        command=command, cwd=str(cwd), started_at=time.time(), timeout_s=timeout,
        metric_name=parse.metric_name, metric_direction=parse.direction,
        provenance=provenance(source, env_info.python, []), price_per_hour=profile.price_per_hour or 0.0,
        chips=profile.chips, notes=[f"scrubbed from the environment: {', '.join(removed)}"] if removed else [],
        sandbox=sandbox,
    )
    if not probe:
        record.notes.append("run without the probe: no device facts, L2 cannot be judged")
    if sandbox_warning:
        record.notes.append(sandbox_warning)
        if progress:
            progress("warning", {"message": sandbox_warning})
    record.notes += [f"link kept: {n}" for n in link_notes]
    if prepared is not None:
        record.notes.append(f"prepared data {prepared.key} ({'prepared now' if prepared.built_now else 'cached'}): "
                            f"{prepared.out}")
    record.save(run_dir)  # a crash from here on still leaves a record with ended_at = None
    if progress:
        progress("start", {"run_dir": str(run_dir), "command": command, "timeout_s": timeout})

    runner = get_runner(profile.runner)
    outcome = runner.execute(RunRequest(argv=command, cwd=cwd, env=env, log_dir=run_dir, timeout_s=timeout,
                                        sandbox=sandbox, read_only=tuple(read_only), writable=tuple(writable)),
                             line_sink(parser, progress, spec.steps(kind)))
    freezer.join(timeout=120)

    record.started_at = outcome.started_at  # the clock the line times (t) are measured from
    record.ended_at = outcome.ended_at
    record.exit_code = outcome.exit_code
    record.timed_out = outcome.timed_out
    record.killed = outcome.killed_by_signal is not None and not outcome.timed_out
    record.log_files = outcome.log_files
    record.provenance.packages = packages
    record.probe = merge_reports(run_dir / "probe") if probe else None
    record.integrity = changes(guarded, protected_state(spec))
    record.notes += collect_export(spec, kind, cwd, run_dir)
    fill_output(record, parser, patterns=kind in ("short", "full"))
    record.infrastructure = starved_collectives(record, profile, env)
    record.save(run_dir)
    write_manifest(run_dir)
    if progress:
        progress("end", end_event(record, run_dir))
    return record


# XLA's fatal line when a collective's participants did not all arrive in time (xla/service/rendezvous.cc)
_RENDEZVOUS_ABORT = re.compile(r"^F\d{4} .*rendezvous\.cc:\d+\] .*Termination timeout for ")


def starved_collectives(record: RunRecord, profile: Profile, env: dict[str, str]) -> InfrastructureFailure | None:
    """A run on fake CPU devices (XLA's host platform split into several devices, PJRT_DEVICE=CPU) that aborted
    because a collective's participants, threads of one process, did not all arrive in time: they were starved
    of the machine's cores by other work. On accelerators the same abort means a rank died or took another
    branch, the code's failure; on the host it is the machine's, and the run is started again."""
    on_host = profile.platform in ("cpu", "jax-cpu") or (profile.platform == "xla" and env.get("PJRT_DEVICE") == "CPU")
    if not on_host or record.exit_code in (0, None) or record.timed_out:
        return None
    fatal = next((line.strip() for line in record.last_lines + record.error_lines if _RENDEZVOUS_ABORT.match(line)), None)
    if fatal is None:
        return None
    return InfrastructureFailure(kind="collectives_starved",
                                 detail=f"a collective of the host's fake devices timed out (exit code "
                                        f"{record.exit_code}): {fatal[:300]}")


def tagged(progress: Progress | None, tags: dict) -> Progress | None:
    """`progress` with the run's identity added to each event's data."""
    if progress is None:
        return None
    return lambda event, data: progress(event, {**tags, **data})


def end_event(record: RunRecord, run_dir: Path) -> dict:
    return {"run_dir": str(run_dir), "exit_code": record.exit_code, "timed_out": record.timed_out,
            "metric_name": record.metric_name, "metric": record.metric, "wall_s": record.wall_s}


def line_sink(parser: OutputParser, progress: Progress | None, steps: int) -> LineSink:
    """Feed each output line to the parser, and report the loss as it comes: the first loss line always (a fast
    program may print all of them in its first 0.1 s), then at most every 0.1 s."""
    last_report = [-math.inf]

    def on_line(stream: str, line: str, t: float) -> None:
        before = parser.loss_lines
        parser.feed(line, t)
        if progress and parser.loss_lines != before and t - last_report[0] > 0.1:
            last_report[0] = t
            progress("loss", {"step": parser.last_step, "loss": parser.last_loss, "t": t, "steps": steps})

    return on_line


def fill_output(record: RunRecord, parser: OutputParser, patterns: bool = True) -> None:
    """What the output said, into the record: curve, metric, evaluations, lines, and notes on the patterns."""
    record.loss_curve = parser.curve
    record.curve_stride = parser.stride
    record.loss_lines = parser.loss_lines
    record.nonfinite_losses = parser.nonfinite
    record.evals = parser.evals
    record.metric = parser.metric
    record.error_lines = parser.error_lines
    record.first_lines = parser.first_lines
    record.last_lines = list(parser.last_lines)
    record.line_count = parser.line_count
    if parser.unreadable:
        record.notes.append(f"{parser.unreadable} loss lines matched [parse].loss but their step or loss is not a number")
    if parser.repeated_steps:
        record.notes.append(f"{parser.repeated_steps} loss lines repeat or go back to an earlier step (first: step "
                            f"{parser.first_repeat}): the curve is read in the order printed; check [parse].loss")
    if patterns:
        record.notes += _pattern_notes(parser)
