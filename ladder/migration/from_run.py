"""`ladder init --from-run`: propose a ladder.toml from a short real run of the program.

It runs the reference's command once, as ladder runs it (a copy of the source, the profile's interpreter,
the secret scrub, the sandbox, the prepare step, the probe), for at most a few minutes, and reads what it
printed (ladder.migration.infer). It finds the seed and step-count flags in `--help` and in the script's
argparse or nanoGPT-style config globals, turns them into `{seed}` and `{steps}` (or, without a seed flag,
sets `[probe] seed`), and sets the thread variables of CPU profiles. The port's side is read the same way
when its command is given; with ANTHROPIC_API_KEY set and no command given, Claude may propose one from the
port's README. The result is a commented TOML text and the findings behind it, each with its reason.

Must not: write the user's ladder.toml (the CLI does, once the user confirms), or run anything but the
given commands, their `--help`, and their prepare steps.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import tempfile
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

from ladder._util.errors import LadderError
from ladder.migration.infer import Finding, ParseProposal, infer_parse
from ladder.migration.spec import CPU_PLATFORMS, PLATFORMS, SpecWarning

PYTHON_TOKEN = re.compile(r"^(?:.*/)?python(?:\d+(?:\.\d+)*)?$")
SEED_FLAG = re.compile(r"(?<![\w-])--?((?:[\w-]*[-_])?seed)\b", re.IGNORECASE)
STEPS_FLAGS = ("steps", "max_steps", "max-steps", "num_steps", "num-steps", "max_iters", "max-iters", "iters",
               "num_iters", "num-iters", "iterations", "total_steps", "total-steps", "train_steps", "train-steps",
               "epochs", "num_epochs", "num-epochs", "n_epochs", "n-epochs", "max_epochs", "max-epochs")
HELP_TIMEOUT_S = 60
DEFAULT_TIMEOUT_S = 300
LLM_MODEL = "claude-sonnet-4-5"
README_NAMES = ("README.md", "README.rst", "README.txt", "README")


@dataclass
class Side:
    """One profile's proposal: how to run it, how to read it, and why."""

    name: str
    command: str  # with {python}, {seed}, {steps}
    python: str
    platform: str
    source: Path
    prepare: list[str] = field(default_factory=list)
    env: dict[str, str] = field(default_factory=dict)
    steps: int | None = None
    full_steps: int | None = None
    probe_seed: bool = False
    parse: ParseProposal = field(default_factory=ParseProposal)
    findings: list[Finding] = field(default_factory=list)
    wall_s: float | None = None
    exit_code: int | None = None
    logged_steps: int | None = None  # the last step its loss lines showed, when no flag sets the length

    @property
    def failed(self) -> bool:
        """The observed run crashed or was cut off: what it printed is no ground to read a log format from."""
        return self.exit_code != 0


def split_command(command: str) -> tuple[dict[str, str], list[str]]:
    """Leading VAR=value assignments, and the argv."""
    try:
        argv = shlex.split(command)
    except ValueError as e:
        raise LadderError(f"cannot split the command {command!r}: {e}", "quote it as a shell would") from None
    env: dict[str, str] = {}
    while argv and re.match(r"^[A-Za-z_]\w*=", argv[0]):
        key, _, value = argv.pop(0).partition("=")
        env[key] = value
    if not argv:
        raise LadderError("the command is empty", 'pass the command that trains, e.g. "python train.py --steps 300"')
    return env, argv


def _script(argv: list[str], source: Path) -> Path | None:
    if len(argv) > 2 and argv[1] == "-m":
        mod = Path(*argv[2].split("."))
        for cand in (source / f"{mod}.py", source / mod / "__main__.py"):
            if cand.is_file():
                return cand
        return None
    start = 1 if PYTHON_TOKEN.match(argv[0]) else 0
    for tok in argv[start:]:
        if not tok.startswith("-"):
            p = source / tok
            return p if p.is_file() else None
    return None


def _help_text(argv: list[str], side: Side) -> str:
    """What `<command> --help` prints (run sandboxed in a scratch copy, cut off after a minute)."""
    from ladder.runs.execute import copy_source
    from ladder.runs.runner import RunRequest, get_runner
    from ladder.runs.runner.sandbox import interpreter_paths
    from ladder.runs.runner.sandbox import resolve as resolve_sandbox
    from ladder.runs.runner.scrub import scrubbed_env

    start = 1 if PYTHON_TOKEN.match(argv[0]) else 0
    script_end = start + (2 if argv[start:start + 1] == ["-m"] else 1)
    help_argv = [side.python] + argv[start:script_end] + ["--help"] if start else argv[:1] + ["--help"]
    lines: list[str] = []
    with tempfile.TemporaryDirectory(prefix="ladder-help-") as tmp:
        work = Path(tmp) / "work"
        copy_source(side.source, work, [], [])
        sandbox, _ = resolve_sandbox("auto")
        env, _ = scrubbed_env(dict(os.environ))
        env.update(side.env)
        get_runner("local").execute(RunRequest(argv=help_argv, cwd=work, env=env, log_dir=Path(tmp) / "log",
                                               timeout_s=HELP_TIMEOUT_S, grace_s=1.0, sandbox=sandbox,
                                               read_only=tuple(interpreter_paths(side.python)),
                                               writable=(work,)),
                                    lambda stream, line, t: lines.append(line))
    return "\n".join(lines[:400])


def _flag_names(help_text: str, source_text: str) -> tuple[set[str], bool, dict[str, str]]:
    """Flags the program accepts (from --help and argparse/click calls), whether it takes nanoGPT-style
    `--key=value` config globals, and the defaults found for them."""
    flags = set(re.findall(r"(?<![\w-])--([A-Za-z][\w-]*)", help_text))
    defaults: dict[str, str] = {}
    for m in re.finditer(r"(?:add_argument|option)\(\s*['\"]--([\w-]+)['\"][^)]*?default\s*=\s*([-+\w.]+)",
                         source_text, re.S):
        flags.add(m.group(1))
        defaults[m.group(1)] = m.group(2)
    flags |= set(re.findall(r"(?:add_argument|option)\(\s*(?:['\"]-\w['\"]\s*,\s*)?['\"]--([\w-]+)['\"]",
                            source_text))
    for m in re.finditer(r"--([\w-]+)[^\n]*?\(?default:?\s*([-+\w.]+)\)?", help_text):
        defaults.setdefault(m.group(1), m.group(2))
    config_globals = "configurator" in source_text and "exec(" in source_text
    if config_globals:
        for m in re.finditer(r"^([A-Za-z_]\w*)\s*=\s*([-+\w.]+)\s*(?:#.*)?$", source_text, re.M):
            flags.add(m.group(1))
            defaults.setdefault(m.group(1), m.group(2))
    return flags, config_globals, defaults


def _set_flag(argv: list[str], names: list[str], placeholder: str) -> tuple[list[str], str | None]:
    """Replace the value of the first of `names` the command passes with a placeholder; (argv, old value)."""
    out = list(argv)
    for i, tok in enumerate(out):
        for name in names:
            if tok.startswith(f"--{name}="):
                old = tok.split("=", 1)[1]
                out[i] = f"--{name}={placeholder}"
                return out, old
            if tok == f"--{name}" and i + 1 < len(out):
                old = out[i + 1]
                out[i + 1] = placeholder
                return out, old
    return out, None


SHELL_OPERATORS = {"&&", "||", ";", "|", "&", ">", ">>", "<", "2>", "2>&1", "2>>"}


def _template(argv: list[str]) -> str:
    """The argv as a command line: `{python}` for an interpreter that starts a command (also after `&&`,
    `;`, ...), shell operators and placeholders left as they are, anything else quoted when it must be."""
    parts = []
    for i, tok in enumerate(argv):
        starts = i == 0 or argv[i - 1] in SHELL_OPERATORS
        if starts and PYTHON_TOKEN.match(tok):
            parts.append("{python}")
        elif tok in SHELL_OPERATORS or re.fullmatch(r"[^\s'\"\\$`;&|<>()]+", tok):
            parts.append(tok)
        else:
            parts.append(shlex.quote(tok))
    return " ".join(parts)


def detect_flags(side: Side, argv: list[str]) -> list[str]:
    """Turn the seed and step-count flags of the command into placeholders; return the new argv."""
    script = _script(argv, side.source)
    source_text = script.read_text(errors="replace") if script else ""
    if script and (script.parent / "configurator.py").is_file():
        source_text += "\n" + (script.parent / "configurator.py").read_text(errors="replace")
    help_text = _help_text(argv, side)
    flags, config_style, defaults = _flag_names(help_text, source_text)
    equals = config_style or any(t.startswith("--") and "=" in t for t in argv)
    seeds = sorted((f for f in flags if SEED_FLAG.fullmatch(f"--{f}")), key=lambda f: (f.lower() != "seed", len(f)))
    if seeds:
        argv, old = _set_flag(argv, seeds, "{seed}")
        if old is None:
            argv = argv + ([f"--{seeds[0]}={{seed}}"] if equals else [f"--{seeds[0]}", "{seed}"])
        where = "config globals" if config_style and seeds[0] not in help_text else "--help / argparse"
        side.findings.append(Finding("seed", f"--{seeds[0]}", f"the program takes it ({where}): each run passes "
                                     "its seed"))
    else:
        side.probe_seed = True
        side.findings.append(Finding("seed", "[probe] seed = true", "no seed flag in --help, argparse or config "
                                     "globals: ladder offsets the seeds the program sets itself, per run"))
    steps = [f for f in STEPS_FLAGS if f in flags or f.replace("-", "_") in flags]
    # a step flag the command passes counts even when no --help or argparse names it (a dataclass config):
    # the program took it and ran
    passed = [f for f in STEPS_FLAGS if any(t == f"--{f}" or t.startswith(f"--{f}=") for t in argv)]
    if passed:
        argv, old = _set_flag(argv, passed, "{steps}")
        side.steps = int(float(old)) if old and re.fullmatch(r"[-+]?\d+(\.0*)?", old) else None
        default = defaults.get(passed[0]) or defaults.get(passed[0].replace("-", "_"))
        side.full_steps = int(float(default)) if default and re.fullmatch(r"\d+(\.0*)?", default) else None
        side.findings.append(Finding("steps", f"--{passed[0]} = {{steps}}", f"the command passes --{passed[0]} "
                                     f"{old}: the short run's length" + (f"; its default is {default}" if side.full_steps
                                                                          else "")))
        argv = _follow_steps(side, argv, old)
    elif steps:
        side.findings.append(Finding("steps", "-", f"the program takes --{steps[0]} but the command does not pass "
                                     "it: add it with {steps} to the short and full commands", ok=False))
    else:
        side.findings.append(Finding("steps", "-", "no step-count flag found: short_steps and full_steps are "
                                     "guesses; pass the run length with {steps}", ok=False))
    return argv


STEP_WORDS = re.compile(r"iter|step|epoch", re.I)


def _follow_steps(side: Side, argv: list[str], value: str | None) -> list[str]:
    """Other step-like flags the command sets to the same number as the run length (nanoGPT's
    --lr_decay_iters, "make equal to max_iters usually") follow {steps}: left literal, the full run would
    keep the short run's schedule."""
    if not value:
        return argv
    out = list(argv)
    for i, tok in enumerate(out):
        if not tok.startswith("--"):
            continue
        name, eq, val = tok[2:].partition("=")
        at = i if eq else i + 1
        if not eq:
            val = out[i + 1] if i + 1 < len(out) else ""
        if val == value and STEP_WORDS.search(name):
            out[at] = f"--{name}={{steps}}" if eq else "{steps}"
            side.findings.append(Finding("steps", f"--{name} = {{steps}}", f"passed the run length ({value}) too: "
                                         "it follows the run's length, so the full run keeps the same schedule; "
                                         "set it back to a literal if it is a fixed number"))
    return out


def guess_platform(source: Path) -> str:
    """cpu, xla or jax-cpu from what the code imports (this machine is assumed to be a CPU one)."""
    text = ""
    for p in list(source.rglob("*.py"))[:400]:
        try:
            text += p.read_text(errors="replace")
        except OSError:
            continue
    if "torch_xla" in text:
        return "xla"
    if re.search(r"^\s*(import jax|from jax)", text, re.M):
        return "jax-cpu"
    return "cpu"


def thread_env(platform: str, env: dict[str, str]) -> dict[str, str]:
    out = dict(env)
    if platform == "xla":
        out.setdefault("PJRT_DEVICE", "CPU")
    if platform in CPU_PLATFORMS or out.get("PJRT_DEVICE") == "CPU":
        out.setdefault("OMP_NUM_THREADS", "1")
    return out


def _toml(value: Any) -> str:
    if isinstance(value, str):
        return f"'{value}'" if "'" not in value and "\n" not in value and value.isprintable() else json.dumps(value)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return repr(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    raise TypeError(type(value))


def _quoted(s: str) -> str:
    return json.dumps(s)


def _provisional(side: Side, workspace: Path, expected_minutes: float) -> Path:
    """A throwaway spec that runs the side once as ladder runs it; its [parse] reads nothing."""
    text = f"""name = "init-{side.name}"
source = {_quoted(str(side.source))}
[experiment]
short = {_quoted(side.command)}
full = {_quoted(side.command)}
short_steps = {side.steps or 1}
full_steps = {side.steps or 1}
expected_minutes_short = {expected_minutes}
expected_minutes_full = {expected_minutes}
[parse]
loss = '^(?!)(?P<step>x)(?P<loss>x)'
metric = '^(?!)(?P<value>x)'
direction = "max"
[probe]
seed = {_toml(side.probe_seed)}
[profiles.{side.name}]
platform = {_quoted(side.platform)}
python = {_quoted(side.python)}
env = {_toml(side.env)}
prepare = {_toml(side.prepare)}
price_per_hour = 1.0
"""
    other = "target" if side.name == "reference" else "reference"
    text += f"[profiles.{other}]\nplatform = {_quoted(side.platform)}\npython = {_quoted(side.python)}\n" \
            f"price_per_hour = 1.0\n"
    path = workspace / "ladder.toml"
    path.write_text(text)
    return path


def read_run_lines(run_dir: Path) -> list[str]:
    """A run's stdout and stderr lines, merged in the order they were printed."""
    stamped: list[tuple[float, int, str]] = []
    for rank, name in enumerate(("stdout.log", "stderr.log")):
        path = run_dir / name
        if not path.is_file():
            continue
        for raw in path.read_text(errors="replace").splitlines():
            t, sep, text = raw.partition("\t")
            try:
                stamped.append((float(t), rank, text) if sep else (0.0, rank, raw))
            except ValueError:
                stamped.append((0.0, rank, raw))
    return [text for _, _, text in sorted(stamped, key=lambda x: (x[0], x[1]))]


def observe(side: Side, command: str, timeout_s: float = DEFAULT_TIMEOUT_S,
            progress: Callable[[str, dict], None] | None = None) -> Side:
    """Detect the flags, run the side once (at most timeout_s), and infer how to read its output."""
    from ladder.migration.spec import load_spec
    from ladder.runs.execute import execute_run

    env, argv = split_command(command)
    side.env = thread_env(side.platform, {**env, **side.env})
    side.prepare = [_template(split_command(cmd)[1]) for cmd in side.prepare]
    argv = detect_flags(side, argv)
    side.command = _template(argv)
    if not PYTHON_TOKEN.match(argv[0]):
        side.findings.append(Finding("python", argv[0], "the command does not start with a Python interpreter: "
                                     "{python} is not used, so the profile's interpreter does not change it",
                                     ok=False))
    with tempfile.TemporaryDirectory(prefix="ladder-init-") as tmp:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", SpecWarning)
            spec = load_spec(_provisional(side, Path(tmp), max(timeout_s / 600.0, 0.1)))
        record = execute_run(spec, side.name, "short", seed=0, run_dir=Path(tmp) / "run", timeout_s=timeout_s,
                             progress=progress)
        lines = read_run_lines(Path(tmp) / "run")
    side.wall_s, side.exit_code = record.wall_s, record.exit_code
    how = (f"cut off after {timeout_s:.0f} s" if record.timed_out else f"exit {record.exit_code}")
    side.findings.append(Finding("run", f"{len(lines)} lines in {record.wall_s or 0:.0f} s ({how})",
                                 f"`{record.command}` in a copy of {side.source}"))
    if record.timed_out:
        side.findings.append(Finding("run", "-", "the run did not finish: a metric printed at the end was not seen; "
                                     "pass fewer steps or a longer --timeout", ok=False))
    elif record.exit_code != 0:
        tail = " | ".join(record.last_lines[-3:])
        side.findings.append(Finding("run", f"exit {record.exit_code}", f"the program failed: {tail}", ok=False))
    side.parse = infer_parse(lines)
    side.findings += side.parse.findings
    if side.steps is None and not side.failed:
        side.logged_steps = last_logged_step(side.parse, lines)
    return side


def last_logged_step(proposal: ParseProposal, lines: list[str]) -> int | None:
    """The step of the last loss line the proposed parse table reads from the run's lines, as a run's parser
    reads it (a `step` group, or epoch and batch); None when the proposal is not a usable table."""
    from pydantic import ValidationError

    from ladder.migration.spec import ParseSpec
    from ladder.runs.parse import OutputParser

    try:
        parser = OutputParser(ParseSpec.model_validate(proposal.table()))
    except (ValidationError, re.error):
        return None
    for line in lines:
        parser.feed(line, 0.0)
    return parser.last_step


def propose_target_command(reference_command: str, port: Path, client: Any | None = None,
                           model: str = LLM_MODEL) -> tuple[str, list[str], str] | None:
    """Ask Claude for the port's command (and data preparation) from its README; None without a key."""
    if client is None and not os.environ.get("ANTHROPIC_API_KEY"):
        return None
    readme = next((port / n for n in README_NAMES if (port / n).is_file()), None)
    if readme is None:
        return None
    import anthropic

    client = client or anthropic.Anthropic()
    scripts = sorted(str(p.relative_to(port)) for p in port.rglob("*.py") if ".git" not in p.parts)[:60]
    prompt = (
        "A PyTorch training repo was ported to another framework. Propose the port's command line that runs the "
        "same experiment as the reference command, with the port's own entry script and flags, taken from its "
        "README. Keep the same run length and evaluation interval. Start the command with `python`. List the "
        "port's data preparation commands, if its README names any.\n\n"
        f"Reference command: {reference_command}\n\nPort files: {', '.join(scripts)}\n\n"
        f"Port README ({readme.name}):\n{readme.read_text(errors='replace')[:12000]}\n\n"
        'Answer with JSON only: {"command": "...", "prepare": ["..."], "why": "one sentence"}'
    )
    try:
        msg = client.messages.create(model=model, max_tokens=600, messages=[{"role": "user", "content": prompt}])
    except anthropic.APIError as e:
        raise LadderError(f"Claude could not propose the port's command ({type(e).__name__}: {e})",
                          "pass --target-run with the port's command") from None
    text = "".join(getattr(b, "text", "") for b in msg.content)
    m = re.search(r"\{.*\}", text, re.S)
    try:
        data = json.loads(m.group()) if m else {}
    except json.JSONDecodeError:
        data = {}
    if not isinstance(data.get("command"), str) or not data["command"].strip():
        raise LadderError("Claude's answer held no command", "pass --target-run with the port's command")
    prepare = [p for p in data.get("prepare") or [] if isinstance(p, str)]
    return data["command"].strip(), prepare, str(data.get("why", ""))


def check_platform(platform: str) -> str:
    if platform not in PLATFORMS:
        raise LadderError(f"unknown platform {platform!r}", f"use one of {', '.join(PLATFORMS)}")
    return platform


def resolve_python(python: str | None, command: str) -> str:
    """The interpreter a side runs with: given, else the one its command names, found on PATH."""
    if python:
        found = shutil.which(python) if os.sep not in python else python
        if not found or not Path(found).exists():
            raise LadderError(f"interpreter {python!r} not found", "give an absolute path or a command on PATH")
        return str(Path(found).absolute())
    _, argv = split_command(command)
    found = shutil.which(argv[0]) if PYTHON_TOKEN.match(argv[0]) else None
    if not found:
        raise LadderError(f"cannot tell which Python runs {command!r}", "pass --python (and --target-python)")
    return found


@dataclass
class Proposal:
    """The proposed ladder.toml and the sides it was read from."""

    text: str
    reference: Side
    target: Side | None

    @property
    def findings(self) -> list[tuple[str, Finding]]:
        return [(s.name, f) for s in (self.reference, self.target) if s is not None for f in s.findings]


def _comment_findings(side: Side) -> list[str]:
    out = [f"#   {side.name}: {'inferred' if f.ok else 'COULD NOT'} {f.topic}: {f.value} ({f.why})"
           for f in side.findings]
    return [line if len(line) <= 200 else line[:197] + "..." for line in out]


def _profile_lines(side: Side, reference: Side | None, workspace: Path, own_seed: bool = False) -> list[str]:
    lines = [f"[profiles.{side.name}]", f"platform = {_quoted(side.platform)}", f"python = {_quoted(side.python)}"]
    if own_seed:
        lines.append("probe_seed = true                  # no seed flag on this side (the other has one): ladder "
                     "offsets the seeds it sets")
    if side.env:
        lines.append(f"env = {_toml(side.env)}")
    if side.prepare:
        lines.append(f"prepare = {_toml(side.prepare)}   # run once per source digest; runs see the files read-only")
    if reference is not None and side.command != reference.command:
        lines += [f"short = {_quoted(side.command)}", f"full = {_quoted(side.command)}"]
    lines.append("price_per_hour = 1.0             # what an hour of this machine costs (L4's cheaper check)")
    if reference is not None:
        if side.source != reference.source:
            rel = os.path.relpath(side.source, workspace)
            lines.insert(1, f"# the port's code: ladder run --on {side.name} --source {rel}")
        if side.failed:
            return lines + ["", f"# [profiles.{side.name}.parse]: not proposed, its run failed (exit "
                            f"{side.exit_code}); the shared [parse] applies until you set it"]
        own = {k: v for k, v in side.parse.table().items() if k in ("loss", "metric", "eval")}
        ref = reference.parse.table()
        over = {k: v for k, v in own.items() if v != ref.get(k)}
        if ref.get("eval") and "eval" not in own:
            over["eval"] = ""
        if over:
            lines += ["", f"[profiles.{side.name}.parse]             # this side prints other lines"]
            lines += [f"{k} = {_toml(v)}" for k, v in over.items()]
    return lines


def full_run_steps(side: Side, short: int, max_hours: float) -> tuple[int, str]:
    """The proposed full run, and why: the program's default step count, unless that run would take longer than
    the stop rule's full-run bound at the observed speed (nanoGPT's default is 600000 iterations): then 10 x the
    short run, for the user to set."""
    default = side.full_steps if side.full_steps and side.full_steps > short else None
    if default is None:
        return short * 10, "a guess: 10 x the short run"
    if side.wall_s:
        hours = side.wall_s * default / short / 3600.0
        if hours > max_hours:
            return short * 10, (f"10 x the short run: the program's default {default} would take about "
                                f"{hours:.0f} h at the observed speed (the full run's bound is {max_hours:g} h); "
                                "set the run you want verified")
    return default, f"the program's default --steps ({default})"


def render_spec(name: str, workspace: Path, reference: Side, target: Side | None) -> str:
    """The commented ladder.toml for the observed sides."""
    from ladder.migration.protocol import load_protocol

    fixed = reference.steps is None and reference.logged_steps
    short = reference.steps or reference.logged_steps or 200
    if fixed:
        # no flag sets the length: every run is the program's own, so a longer "full" run would be a lie
        full, full_why = short, "the same run: no flag sets the run length"
        reference.findings.append(Finding("steps", str(short), f"the run logged steps up to {short} and no flag sets "
                                          "the length: short and full runs are both this run; add a step flag and "
                                          "pass {steps} to shorten the short run", ok=False))
    else:
        full, full_why = full_run_steps(reference, short, load_protocol("ncsu").limits.max_full_run_hours)
    if not full_why.startswith(("a guess", "the program's default", "the same run")):
        reference.findings.append(Finding("full_steps", str(full), full_why, ok=False))
    minutes = max(1.0, round((reference.wall_s or 60.0) * 1.5 / 60.0, 1))
    parse = reference.parse.table()
    # [probe] seed for both sides when neither has a seed flag; else only the side without one seeds by the probe
    probe_seed = reference.probe_seed and (target is None or target.probe_seed)
    head = ["# ladder.toml proposed by `ladder init --from-run` from real runs: review it, then",
            "#   ladder baseline --seeds 3   and   ladder run --on target" + (
                f" --source {os.path.relpath(target.source, workspace)}" if target and
                target.source != reference.source else ""),
            "# What was inferred, and why:"]
    head += _comment_findings(reference) + (_comment_findings(target) if target else [])
    lines = head + [
        "", f"name = {_quoted(name)}", f"source = {_quoted(os.path.relpath(reference.source, workspace))}",
        'protocol = "ncsu"', "", "[experiment]", f"short = {_quoted(reference.command)}",
        f"full = {_quoted(reference.command)}",
        f"short_steps = {short}" + ("" if reference.steps else "                # " + (
            "as logged: no step-count flag" if fixed else "a guess: no step-count flag")),
        f"full_steps = {full}" + ("" if full == reference.full_steps else f"                # {full_why[:120]}"),
        f"expected_minutes_short = {minutes}    # 1.5 x the observed run; the timeout is 10 x this",
        f"expected_minutes_full = {round(minutes * full / short, 1)}", "",
    ] + ([f"# read from a run that FAILED (exit {reference.exit_code}): check every pattern"]
         if reference.failed else []) + ["[parse]"]
    lines += [f"{k} = {_toml(v)}" for k, v in parse.items()]
    if probe_seed:
        lines += ["", "[probe]", "seed = true                        # no seed flag: ladder offsets the seeds the "
                  "program sets, per run"]
    lines += [""] + _profile_lines(reference, None, workspace, reference.probe_seed and not probe_seed) + [""]
    if target is not None:
        lines += _profile_lines(target, reference, workspace, target.probe_seed and not probe_seed)
    else:
        lines += ["# The port's side: set its platform and python; give it its own short/full and",
                  "# [profiles.target.parse] if it takes other flags or prints other lines.",
                  "[profiles.target]", f"platform = {_quoted(reference.platform)}",
                  f"python = {_quoted(reference.python)}"]
        if reference.env:
            lines.append(f"env = {_toml(reference.env)}")
        lines.append("price_per_hour = 1.0")
    return "\n".join(lines) + "\n"


def propose(command: str, source: Path, workspace: Path, *, python: str | None = None, platform: str = "cpu",
            prepare: list[str] | None = None, target_command: str | None = None, target_source: Path | None = None,
            target_python: str | None = None, target_platform: str | None = None,
            target_prepare: list[str] | None = None, name: str | None = None,
            timeout_s: float = DEFAULT_TIMEOUT_S, client: Any | None = None,
            progress: Callable[[str, str, dict], None] | None = None) -> Proposal:
    """Run the reference (and the port, when its command is given or Claude proposes one) and propose the spec."""
    source = source.resolve()
    if not source.is_dir():
        raise LadderError(f"source {source} is not a directory", "pass --source DIR, the repo to port")
    target_source = (target_source or source).resolve()

    def cb(side: str):
        return (lambda event, data: progress(side, event, data)) if progress else None

    ref = Side("reference", "", resolve_python(python, command), check_platform(platform), source,
               prepare=list(prepare or []))
    observe(ref, command, timeout_s, cb("reference"))
    claude: Finding | None = None
    if target_command is None and target_source != source:
        got = propose_target_command(command, target_source, client)
        if got is not None:
            target_command, proposed_prepare, why = got
            target_prepare = target_prepare or proposed_prepare
            claude = Finding("command", target_command, f"proposed by Claude from the port's README: {why}")
    tgt = None
    if target_command is not None:
        tgt = Side("target", "", resolve_python(target_python or python, target_command),
                   check_platform(target_platform or guess_platform(target_source)), target_source,
                   prepare=list(target_prepare or []))
        if claude is not None:
            tgt.findings.append(claude)
        if target_platform is None:
            tgt.findings.append(Finding("platform", tgt.platform, "from what the port imports; set it if the port "
                                        "runs elsewhere"))
        observe(tgt, target_command, timeout_s, cb("target"))
        if tgt.parse.metric_name != ref.parse.metric_name:
            tgt.findings.append(Finding("metric_name", ref.parse.metric_name, f"the port calls it "
                                        f"`{tgt.parse.metric_name}`: both sides are compared as "
                                        f"`{ref.parse.metric_name}`"))
        if tgt.parse.direction and tgt.parse.direction != ref.parse.direction:
            tgt.findings.append(Finding("direction", ref.parse.direction or "-", "the port's metric name suggests "
                                        f"{tgt.parse.direction}: check that both sides print the same metric",
                                        ok=False))
    text = render_spec(name or f"{source.name}-port", workspace.resolve(), ref, tgt)
    return Proposal(text, ref, tgt)
