"""The migration spec (`ladder.toml`): what to run, how to read its output, and where.

Loading validates everything and reports every problem at once (key, value, fix). Paths in the spec
are relative to the spec file's directory, which is also the migration workspace: ladder writes
`baselines/<name>/`, `journals/<name>/` and `runs/` there.

The two sides of a port often differ: another entry script, other flags, other log lines. `[experiment]`
and `[parse]` are the defaults; a profile may set its own `short`, `full`, `cwd`, `prepare` and a
`[profiles.<name>.parse]` table whose keys replace the shared `[parse]` keys one by one (the metric's
name and direction belong to the experiment and stay shared). Loading also collects warnings (a run
that cannot vary its seed, threads left to the machine, a number group that swallows punctuation):
they are kept on `Spec.warnings` and issued as `SpecWarning`s, which the CLI prints.
"""

from __future__ import annotations

import re
import string
import tomllib
import warnings
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ladder._util.errors import LadderError, SpecError
from ladder._util.validation import validate_or_raise

PLATFORMS = ("cpu", "cuda", "mps", "xla", "tpu", "jax-cpu", "jax-gpu", "jax-tpu")
BUILTIN_PLACEHOLDERS = {"python", "seed", "run_dir", "steps"}
PREPARE_PLACEHOLDERS = {"python", "prepared"}  # a prepare step runs once for every seed and run
RUN_KINDS = ("short", "full")
CPU_PLATFORMS = ("cpu", "jax-cpu")
DEFAULT_ERROR_PATTERN = r"Traceback \(most recent call last\)|^\w*Error\b|\bERROR\b|FATAL|Segmentation fault|Killed"


class _Model(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _compile(pattern: str, groups: set[str], key: str) -> str:
    try:
        rx = re.compile(pattern)
    except re.error as e:
        raise ValueError(f"not a valid regular expression ({e}); test it with python's re module")
    missing = groups - set(rx.groupindex)
    if missing:
        raise ValueError(f"the {key} pattern needs named groups {sorted(missing)}, e.g. (?P<{sorted(missing)[0]}>\\S+)")
    return pattern


def _loss_pattern(v: str) -> str:
    _compile(v, {"loss"}, "loss")
    groups = set(re.compile(v).groupindex)
    if "step" not in groups and not {"epoch", "batch"} <= groups:
        raise ValueError("the loss pattern needs a named group `step`, or `epoch` and `batch` (with `batches`, "
                         "the batches per epoch, when the line prints it), e.g. (?P<step>\\d+)")
    return v


class _Patterns(_Model):
    """The checks every log pattern gets, in [parse] and in a profile's own parse table."""

    @field_validator("loss", check_fields=False)
    @classmethod
    def _loss(cls, v: str | None) -> str | None:
        return None if v is None else _loss_pattern(v)

    @field_validator("metric", check_fields=False)
    @classmethod
    def _metric(cls, v: str | None) -> str | None:
        return None if v is None else _compile(v, {"value"}, "metric")

    @field_validator("eval", "error", check_fields=False)
    @classmethod
    def _any(cls, v: str | None) -> str | None:
        return None if v is None else _compile(v, set(), "eval/error")


class ParseSpec(_Patterns):
    loss: str = Field(description="regex with named groups `step` and `loss`, or `epoch`, `batch` (and optionally "
                                  "`batches`, the batches per epoch) and `loss`")
    metric: str = Field(description="regex with a named group `value` for the headline metric")
    metric_name: str = "metric"
    direction: Literal["max", "min"]
    eval: str | None = Field(default=None, description="regex for evaluation lines; numeric named groups are kept "
                             "('' for none)")
    error: str = DEFAULT_ERROR_PATTERN


class ParseOverride(_Patterns):
    """A profile's own log patterns: each key set replaces the shared [parse] key for that profile only."""

    loss: str | None = None
    metric: str | None = None
    eval: str | None = Field(default=None, description="'' when this side prints no evaluation lines")
    error: str | None = None
    metric_name: str | None = None
    direction: str | None = None

    @field_validator("metric_name", "direction")
    @classmethod
    def _shared(cls, v: str | None) -> str | None:
        raise ValueError("the metric's name and direction belong to the experiment, not to one side's log format: "
                         "set them in [parse] (both sides are compared on the same metric)")


class Experiment(_Model):
    short: str | None = Field(default=None, description="command of the short run; placeholders {python} {seed} "
                              "{run_dir} {steps} and vars, with integer arithmetic ({steps+1}); a profile's own "
                              "`short` replaces it")
    full: str | None = None
    short_steps: int = Field(gt=0)
    full_steps: int = Field(gt=0)
    expected_minutes_short: float = Field(gt=0)
    expected_minutes_full: float = Field(gt=0)
    vars: dict[str, str] = Field(default_factory=dict)


class SshTarget(_Model):
    """Where an `ssh` profile runs: a host of ~/.ssh/config (or of `config`), as the system `ssh` reaches it."""

    host: str = Field(description="a host name or an alias of the ssh config")
    user: str | None = None
    port: int | None = Field(default=None, gt=0, lt=65536)
    identity_file: str | None = None
    config: str | None = Field(default=None, description="an ssh_config file (ssh -F); default: ~/.ssh/config")
    known_hosts: str | None = Field(default=None, description="UserKnownHostsFile for this host")
    options: dict[str, str] = Field(default_factory=dict, description="more `ssh -o` options")
    root: str = Field(default="~/.ladder", description="the directory ladder works in on that machine")
    python: str = Field(default="python3", description="the interpreter that runs ladder's agent there (3.8+, "
                        "standard library only); `setup`'s {python}")
    cache: str | None = Field(default=None, description="LADDER_CACHE there: where environments are built, once "
                              "per hash of their setup commands (default: <root>/cache)")


class SkyPilotTarget(_Model):
    """What a `skypilot` profile asks SkyPilot for: the resources of its Task, and the cluster to launch or reuse."""

    cluster: str = Field(pattern=r"^[a-z][a-z0-9-]{0,62}$", description="the cluster to launch, or reuse when up")
    accelerators: str | None = Field(default=None, description="e.g. 'A100:1', 'L4:1' or 'tpu-v5e-8'")
    infra: str | None = Field(default=None, description="SkyPilot's infra string, e.g. 'gcp', 'gcp/us-central1', "
                              "'k8s'")
    instance_type: str | None = None
    use_spot: bool = False
    autostop_minutes: int | None = Field(default=30, ge=0, description="stop the cluster after this many idle "
                                         "minutes (None: never)")
    down: bool = Field(default=False, description="tear the cluster down at autostop instead of stopping it")
    root: str = "~/.ladder"
    python: str = "python3"


class Profile(_Model):
    platform: str
    runner: Literal["local", "ssh", "skypilot"] = "local"
    ssh: SshTarget | None = Field(default=None, description="for runner = \"ssh\": the machine")
    skypilot: SkyPilotTarget | None = Field(default=None, description="for runner = \"skypilot\": the resources")
    parallel: int = Field(default=1, gt=0, description="baseline runs at once on this profile's machine (one per "
                          "accelerator: each run gets LADDER_SLOT = 0..parallel-1)")
    python: str | None = None
    setup: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    pass_env: list[str] = Field(default_factory=list, description="variables passed despite looking secret")
    vars: dict[str, str] = Field(default_factory=dict)
    price_per_hour: float | None = Field(default=None, ge=0, description="required, except with runner = "
                                         "\"skypilot\", where SkyPilot's catalog price is the default")
    chips: int = Field(default=1, gt=0)
    workdir: Literal["copy", "inplace"] = "copy"
    sandbox: Literal["auto", "bwrap", "none"] = Field(default="auto", description="bwrap: runs see only their "
                                                      "own directory, their environment and the mounts; auto: bwrap "
                                                      "when it works here, else none with a warning")
    mounts: list[str] = Field(default_factory=list, description="directories a run may read (data): read-only in "
                              "the sandbox, never copied; relative to ladder.toml")
    copy_ignore: list[str] = Field(default_factory=list, description="glob patterns left out of each run's copy of "
                                   "the source (big data that a mount provides)")
    # This side's own way to run and read the program (None: the shared [experiment] / [parse]).
    short: str | None = Field(default=None, description="this profile's short-run command")
    full: str | None = Field(default=None, description="this profile's full-run command")
    cwd: str = Field(default=".", description="working directory of runs, relative to the root of the source copy")
    parse: ParseOverride | None = None
    prepare: list[str] = Field(default_factory=list, description="commands run once per source digest (data "
                               "download, tokenisation) in a scratch copy of the source; the files they create "
                               "or change are cached and every run sees them read-only")
    prepare_inputs: list[str] = Field(default_factory=list, description="glob patterns of the source files the "
                                      "prepare step depends on (default: every file): an edit elsewhere reuses it")
    prepare_timeout_minutes: float = Field(default=60, gt=0)
    probe_seed: bool | None = Field(default=None, description="this side's own [probe] seed: true for a side that "
                                    "seeds itself from constants while the other takes a seed flag (None: [probe] "
                                    "seed)")

    @field_validator("platform")
    @classmethod
    def _platform(cls, v: str) -> str:
        if v not in PLATFORMS:
            raise ValueError(f"unknown platform; use one of {', '.join(PLATFORMS)}")
        return v

    @field_validator("cwd")
    @classmethod
    def _cwd(cls, v: str) -> str:
        p = PurePosixPath(v)
        if p.is_absolute() or ".." in p.parts:
            raise ValueError("cwd is a directory inside the source (e.g. 'src' or 'ports/jax'), not an absolute "
                             "path and not above the source")
        return v

    @model_validator(mode="after")
    def _runner(self) -> "Profile":
        from ladder.runs.remote.targets import runner_problems

        problems = runner_problems(self)
        if problems:
            raise ValueError("; ".join(problems))
        return self


class ProbeSpec(_Model):
    """Options of the probe injected into every run (the same for every profile, so runs compare)."""

    grad_norms: bool = Field(default=True, description="record the norm of the gradient the optimizer is handed")
    grad_norm_budget: float = Field(default=0.02, ge=0, le=1, description="largest share of a step's time the "
                                    "norms may take: beyond it they are recorded every k-th step (0: every step)")
    sample_every: int = Field(default=50, ge=0, description="optimizer steps between device samples (0: never)")
    param_nonfinite: bool = Field(default=False, description="check sampled parameters for NaN/inf at exit")
    seed: bool = Field(default=False, description="offset the seeds a program sets from constants (torch.manual_seed, "
                       "numpy.random.seed / default_rng, random.seed, jax.random.PRNGKey / key) by the run's seed: for "
                       "programs without a seed flag")


ADAPTER = r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$"


class ParitySpec(_Model):
    """Tensor-level parity (L1 `parity`) and the port's weights loaded back (L3 `weights_load_back`).
    Adapters are `module:function` names in each side's own source (ladder/parity/side.py: the convention)."""

    reference: str = Field(pattern=ADAPTER, description="the reference's adapter: draws its initial weights and "
                           "fixed batches, returns outputs, loss, gradients and parameters after K steps")
    target: str = Field(pattern=ADAPTER, description="the port's adapter: the same, from the reference's weights")
    evaluate: str | None = Field(default=None, pattern=ADAPTER, description="in the reference: its own evaluation "
                                 "of named weights (weights_load_back)")
    export: str | None = Field(default=None, description="the weights file (.npz, the reference's names) the port's "
                               "full run writes in its working directory; kept in the run directory")
    tolerance: str = Field(default="auto", description="a [parity.tolerances] table of the protocol; auto: tpu on a "
                           "TPU platform, else fp32-cpu")
    seed: int = 0


class GradeSpec(_Model):
    """`ladder grade`: how the finished port is re-run from nothing, and what its evaluation may read."""

    setup: str = Field(description="the port's own setup file, relative to its root: a requirements*.txt (installed "
                       "into a fresh venv) or a shell script run as `bash FILE ENV_DIR` that creates ENV_DIR/bin/python")
    entry: str = Field(default="train.py", description="the entry script: a frozen second stage may change it")
    test_split: list[str] = Field(default_factory=list, description="data files of the test split (relative to the "
                                  "port's root): evaluation should read these")
    train_split: list[str] = Field(default_factory=list, description="data files of the training split: evaluation "
                                   "must not read these")


class GitHubSpec(_Model):
    """One pull request per attempt, opened when GITHUB_TOKEN is set (never read from the spec)."""

    repo: str = Field(pattern=r"^[^/\s]+/[^/\s]+$", description="owner/name on GitHub")
    api_url: str | None = Field(default=None, description="REST API root; default api.github.com")
    remote: str = "origin"  # the git remote of the source repo that GitHub serves
    base: str = "main"  # the branch pull requests merge into


class Spec(_Model):
    name: str = Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")
    source: str
    protocol: str = "ncsu"
    protocol_overrides: dict[str, Any] = Field(default_factory=dict)
    experiment: Experiment
    parse: ParseSpec
    profiles: dict[str, Profile]
    timeout_minutes: float | None = Field(default=None, gt=0, description="overrides factor x expected minutes")
    github: GitHubSpec | None = None
    probe: ProbeSpec = Field(default_factory=ProbeSpec)
    parity: ParitySpec | None = None
    grade: GradeSpec | None = None

    # Set by load_spec, not read from the file.
    path: Path | None = Field(default=None, exclude=True)
    warnings: list[tuple[str, object, str]] = Field(default_factory=list, exclude=True)  # (key, value, why)

    @property
    def workspace(self) -> Path:
        return self.path.parent if self.path else Path.cwd()

    @property
    def source_dir(self) -> Path:
        p = Path(self.source)
        return p if p.is_absolute() else (self.workspace / p).resolve()

    def resolve_path(self, p: str) -> Path:
        path = Path(p).expanduser()
        return (path if path.is_absolute() else self.workspace / path).resolve()

    @property
    def baselines_dir(self) -> Path:
        return self.workspace / "baselines" / self.name

    @property
    def journal_dir(self) -> Path:
        return self.workspace / "journals" / self.name

    @property
    def runs_dir(self) -> Path:
        return self.workspace / "runs" / self.name

    def profile(self, name: str) -> Profile:
        if name not in self.profiles:
            raise LadderError(f"no profile {name!r} in {self.path}", f"use one of {sorted(self.profiles)}")
        return self.profiles[name]

    def command(self, kind: str, profile: str | None = None) -> str:
        """The command of a short or full run on a profile: the profile's own, else [experiment]'s."""
        own = getattr(self.profiles[profile], kind, None) if profile in self.profiles else None
        cmd = own or getattr(self.experiment, kind)
        if cmd is None:  # load_spec refuses such a spec; a Spec built in code may still lack one
            raise LadderError(f"no {kind} command for profile {profile!r}",
                              f"set [experiment] {kind} or [profiles.{profile}] {kind}")
        return cmd

    def parse_for(self, profile: str | None = None) -> ParseSpec:
        """The log patterns of a profile: [parse], with the profile's [profiles.<name>.parse] keys replacing it."""
        over = self.profiles[profile].parse if profile in self.profiles else None
        if over is None:
            return self.parse
        changes = over.model_dump(exclude_unset=True, exclude={"metric_name", "direction"})
        return self.parse.model_copy(update={k: (v or None) if k == "eval" else v for k, v in changes.items()})

    def probe_options(self, profile: Profile) -> ProbeSpec:
        """The probe's options for a profile's runs: [probe], with the profile's own `probe_seed`."""
        if profile.probe_seed is None:
            return self.probe
        return self.probe.model_copy(update={"seed": profile.probe_seed})

    def steps(self, kind: str) -> int:
        return self.experiment.short_steps if kind == "short" else self.experiment.full_steps

    def expected_minutes(self, kind: str) -> float:
        return self.experiment.expected_minutes_short if kind == "short" else self.experiment.expected_minutes_full


ARITHMETIC = re.compile(r"^\s*(?P<name>[A-Za-z_]\w*)\s*(?P<op>\+|-|\*|//)\s*(?P<n>\d+)\s*$")


class CommandFormatter(string.Formatter):
    """str.format, plus integer arithmetic on one placeholder and a constant: {steps+1}, {steps//2}, {seed*100}
    (a port that must run max_iters = steps + 1 to evaluate at the last step)."""

    def get_field(self, field_name: str, args: Any, kwargs: Any) -> Any:
        m = ARITHMETIC.match(field_name)
        if m is None:
            return super().get_field(field_name, args, kwargs)
        raw = str(kwargs[m["name"]]).strip("'\"")
        try:
            value, n = int(raw), int(m["n"])
        except ValueError:
            raise ValueError(f"{{{field_name}}}: {m['name']} is {raw!r}, not an integer") from None
        op = m["op"]
        if op == "//" and n == 0:
            raise ValueError(f"{{{field_name}}}: division by zero")
        return {"+": value + n, "-": value - n, "*": value * n, "//": value // max(n, 1)}[op], field_name


def fill_command(template: str, values: dict[str, str]) -> str:
    """A command template with its placeholders filled (arithmetic included: CommandFormatter)."""
    return CommandFormatter().vformat(template, (), values)


def _placeholders(cmd: str) -> set[str]:
    """The names a command uses ({steps+1} uses steps)."""
    try:
        fields = {f for _, f, _, _ in string.Formatter().parse(cmd) if f}
    except ValueError:
        return {"<unbalanced braces>"}
    return {m["name"] if (m := ARITHMETIC.match(f)) else f for f in fields}


def _semantic_problems(raw: dict[str, Any], base: Path) -> list[tuple[str, object, str]]:
    """Cross-field problems pydantic's per-field validation cannot see; tolerant of a broken structure."""
    problems: list[tuple[str, object, str]] = []
    source = raw.get("source")
    if isinstance(source, str):
        p = Path(source) if Path(source).is_absolute() else base / source
        if not p.is_dir():
            problems.append(("source", source, f"directory {p} does not exist; point it at the repo to port"))
    profiles = raw.get("profiles") if isinstance(raw.get("profiles"), dict) else {}
    for required in ("reference", "target"):
        if required not in profiles:
            problems.append((f"profiles.{required}", "<missing>", f"add a [profiles.{required}] table"))
    exp = raw.get("experiment") if isinstance(raw.get("experiment"), dict) else {}
    exp_vars = set(exp.get("vars", {}) or {}) if isinstance(exp.get("vars", {}), dict) else set()
    for name, prof in profiles.items():
        prof = prof if isinstance(prof, dict) else {}
        pvars = set(prof.get("vars", {}) or {}) if isinstance(prof.get("vars", {}), dict) else set()
        prepared = {"prepared"} if prof.get("prepare") else set()
        for kind in RUN_KINDS:
            key, cmd = _command_source(exp, prof, name, kind)
            if cmd is None:
                problems.append((f"profiles.{name}.{kind}", "<missing>",
                                 f"no {kind} command for this profile: set [experiment] {kind} or "
                                 f"[profiles.{name}] {kind}"))
                continue
            if not isinstance(cmd, str):
                continue
            unknown = _placeholders(cmd) - BUILTIN_PLACEHOLDERS - prepared - exp_vars - pvars
            if unknown:
                hint = (" ({prepared} needs a `prepare` step in this profile)" if "prepared" in unknown else "")
                problems.append((key, cmd, f"placeholders {sorted(unknown)} are not defined for profile {name!r}: "
                                 f"add them to [experiment.vars] or [profiles.{name}.vars]{hint}"))
        for i, cmd in enumerate(prof.get("prepare") or []):
            if not isinstance(cmd, str):
                continue
            unknown = _placeholders(cmd) - PREPARE_PLACEHOLDERS - exp_vars - pvars
            if unknown:
                problems.append((f"profiles.{name}.prepare.{i}", cmd,
                                 f"placeholders {sorted(unknown)} are not defined for a prepare step, which runs "
                                 "once for every seed ({python}, {prepared} and vars only)"))
        if prof.get("python") and prof.get("setup") and "{env}" not in str(prof["python"]):
            problems.append((f"profiles.{name}.python", prof["python"],
                             "with `setup`, python must name the built interpreter, e.g. '{env}/bin/python'"))
    return problems


def _command_source(exp: dict, prof: dict, name: str, kind: str) -> tuple[str, object]:
    """Where a profile's command of one kind comes from (its key in the file) and the command."""
    if prof.get(kind) is not None:
        return f"profiles.{name}.{kind}", prof[kind]
    return f"experiment.{kind}", exp.get(kind)


class SpecWarning(UserWarning):
    """Something in a valid spec that will likely make the comparison weak; the CLI prints it."""


# A number group should stop at the punctuation around it: `\S+` takes `2.5050;` from `val loss 2.5050; best`.
PUNCTUATION_SAMPLES = ("1.5;", "1.5,", "1.5)", "1.5]", "1.5|", "1.5%", "10/200", "1.5:")
NUMBER_GROUP = r"[-+.\w]+"  # digits, sign, point, exponent, nan, inf; stops at ; , ) ] | % / :
NON_NUMERIC_GROUPS = {"name", "split", "tag", "phase", "mode", "label"}


def group_pattern(pattern: str, name: str) -> str | None:
    """The source text inside the named group `(?P<name>...)` of a regex, or None."""
    start = pattern.find(f"(?P<{name}>")
    if start < 0:
        return None
    i = start + len(f"(?P<{name}>")
    depth, in_class, escaped, body = 1, False, False, i
    while i < len(pattern):
        c = pattern[i]
        if escaped:
            escaped = False
        elif c == "\\":
            escaped = True
        elif in_class:
            in_class = c != "]" or pattern[i - 1] == "["
        elif c == "[":
            in_class = True
        elif c == "(":
            depth += 1
        elif c == ")":
            depth -= 1
            if depth == 0:
                return pattern[body:i]
        i += 1
    return None


def swallows_punctuation(pattern: str, group: str) -> str | None:
    """The sample (e.g. '1.5;') that the group would capture whole, punctuation included; None if none."""
    inner = group_pattern(pattern, group)
    if inner is None:
        return None
    try:
        rx = re.compile(f"(?:{inner})")
    except re.error:
        return None
    return next((s for s in PUNCTUATION_SAMPLES if rx.fullmatch(s)), None)


def _is_cpu(profile: Profile) -> bool:
    return profile.platform in CPU_PLATFORMS or (profile.platform == "xla" and profile.env.get("PJRT_DEVICE") == "CPU")


def spec_warnings(spec: Spec) -> list[tuple[str, object, str]]:
    """What loads fine but will likely weaken the comparison: (key, value, why and the fix)."""
    out: dict[str, tuple[str, object, str]] = {}
    exp = spec.experiment.model_dump()
    for name, prof in spec.profiles.items():
        for kind in RUN_KINDS:
            key, cmd = _command_source(exp, prof.model_dump(), name, kind)
            if isinstance(cmd, str) and "seed" not in _placeholders(cmd) and not spec.probe_options(prof).seed:
                out[key] = (key, cmd, "no {seed} in the command and [probe] seed is off: every seed runs the same "
                            "program, so the baseline's spread is zero (or the clock's): pass the seed with a flag, "
                            "or set [probe] seed = true (or the profile's probe_seed = true) for a program that seeds "
                            "itself from a constant")
        if _is_cpu(prof) and "OMP_NUM_THREADS" not in prof.env:
            out[f"profiles.{name}.env"] = (f"profiles.{name}.env", prof.env, "OMP_NUM_THREADS is not set on a CPU "
                                           "profile: the run takes every core (and whatever this shell sets), which "
                                           "on a shared machine can make it many times slower and the timings "
                                           "incomparable: set env = { OMP_NUM_THREADS = \"1\" } (or the cores a run "
                                           "may use alone)")
        over = prof.parse.model_dump(exclude_unset=True) if prof.parse else {}
        for field in ("loss", "metric", "eval"):
            pattern = over.get(field) or (getattr(spec.parse, field) if field not in over else None)
            if not pattern:
                continue
            key = f"profiles.{name}.parse.{field}" if field in over else f"parse.{field}"
            for group in re.compile(pattern).groupindex:
                sample = None if group in NON_NUMERIC_GROUPS else swallows_punctuation(pattern, group)
                if sample:
                    out[key] = (key, pattern, f"the group `{group}` would capture {sample!r} whole, punctuation "
                                f"included, and the number would not read: use (?P<{group}>{NUMBER_GROUP}) (it "
                                "keeps nan and inf) or a pattern that stops before the punctuation")
                    break
    return list(out.values())


def load_spec(path: Path | str | None = None) -> Spec:
    path = Path(path or "ladder.toml")
    if path.is_dir():
        path = path / "ladder.toml"
    if not path.exists():
        raise LadderError(f"no spec at {path}", "run `ladder init` to write a commented template, or pass --spec")
    try:
        raw = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SpecError(str(path), [("<file>", "", f"not valid TOML: {e}")]) from None
    base = path.parent.resolve()
    semantic = _semantic_problems(raw, base)
    try:
        spec = validate_or_raise(Spec, raw, str(path))
    except SpecError as e:
        raise SpecError(str(path), e.problems + semantic) from None
    if semantic:
        raise SpecError(str(path), semantic)
    spec.path = path.resolve()
    # The protocol must load too (with the overrides) before anything runs.
    from ladder.migration.protocol import load_protocol

    protocol = load_protocol(spec.protocol, spec.protocol_overrides or None, base)
    if spec.parity and spec.parity.tolerance not in ("auto", *protocol.parity.tolerances):
        raise SpecError(str(path), [("parity.tolerance", spec.parity.tolerance,
                                     f"use auto or one of the protocol's {sorted(protocol.parity.tolerances)}")])
    spec.warnings = spec_warnings(spec)
    for key, value, why in spec.warnings:
        warnings.warn(SpecWarning(f"{path}: {key} = {value!r}: {why}"), stacklevel=2)
    return spec


def load_spec_protocol(spec: Spec):  # -> Protocol
    from ladder.migration.protocol import load_protocol

    return load_protocol(spec.protocol, spec.protocol_overrides or None, spec.workspace)


TEMPLATE = '''# ladder.toml: how ladder runs and reads your training repo, before and after the port.
# Check it with `ladder run --on reference --kind short`; every problem is reported at once.
# `ladder init --from-run "python train.py ..."` writes one from what your program really prints.

name = "my-migration"            # names baselines/<name>/ and journals/<name>/
source = "."                     # the repo to port, relative to this file
protocol = "ncsu"                # protocols/ncsu.toml (fixed 5%/1% rule) or "xstack"

# Override any protocol value, e.g. a looser loss tolerance:
# [protocol_overrides.l1]
# loss_rel_tol = 0.05

[experiment]
# The default commands of both sides (a profile may set its own `short` / `full`).
# Placeholders: {python} (the profile's interpreter), {seed}, {steps}, {run_dir}, {prepared} (the
# profile's prepared data, see `prepare`), and any var below.
short = "{python} train.py --seed {seed} --steps {steps} --device {device}"
full = "{python} train.py --seed {seed} --steps {steps} --device {device}"
short_steps = 200                # the protocol asks for >= 200 steps
full_steps = 2000
expected_minutes_short = 2       # the timeout is protocol.timeout.factor (10) x this
expected_minutes_full = 30

[parse]
# Regular expressions searched in every output line (stdout and stderr). A number group should stop
# at the punctuation around it: [-+.\\w]+ reads 2.5050 from "val loss 2.5050; best ..." (\\S+ would not).
loss = 'step (?P<step>\\d+) loss (?P<loss>[-+.\\w]+)'
metric = 'metric test_acc=(?P<value>[-+.\\w]+)'
metric_name = "test_acc"
direction = "max"                # "max" if higher is better, else "min"
eval = 'eval step (?P<step>\\d+) items (?P<items>\\d+)'   # optional

# [probe]
# seed = true                    # the program has no seed flag: ladder offsets the seeds it sets itself
#                                # (one side only: probe_seed = true in its [profiles.<name>])

# Optional: tensor-level parity (L1 `parity`) and the port's weights loaded back (L3 `weights_load_back`).
# [parity]
# reference = "parity_adapter:parity"   # module:function in this repo (convention: ladder/parity/side.py)
# target = "parity_adapter:parity"      # module:function in the port
# evaluate = "parity_adapter:evaluate"  # this repo's own evaluation of named weights
# export = "weights.npz"                # the weights the port's full run writes, keyed by this repo's names

# Optional: `ladder grade` (the XStack grading of the finished port).
# [grade]
# setup = "setup_env.sh"                # the port's own setup file (or a requirements.txt)
# test_split = ["data/test.npz"]        # the data files evaluation should read

[profiles.reference]             # the old hardware
platform = "cpu"                 # cpu, cuda, mps, xla, tpu, jax-cpu, jax-gpu, jax-tpu
python = "python3"               # an interpreter, or `setup` commands (below)
env = { OMP_NUM_THREADS = "1" }  # threads left unset take every core: slow and noisy on a shared machine
price_per_hour = 1.0
chips = 1
vars = { device = "cpu" }
# prepare = ["{python} data/prepare.py"]   # once per source digest; runs see its files read-only

[profiles.target]                # the new hardware
platform = "xla"
setup = [                        # run once into a cached environment {env}
  "{python} -m venv {env}",
  "{env}/bin/pip install torch==2.9.0 torch-xla==2.9.0",
]
python = "{env}/bin/python"
env = { PJRT_DEVICE = "CPU", OMP_NUM_THREADS = "1" }
pass_env = []                    # variables to pass even though they look like secrets
price_per_hour = 1.0
chips = 1
vars = { device = "xla" }
# The port's own entry script, flags and log lines, when they differ from the reference's:
# short = "{python} main.py --num-steps {steps} --rng {seed}"
# full = "{python} main.py --num-steps {steps} --rng {seed}"
# cwd = "."                      # runs start here, inside the source copy
# [profiles.target.parse]        # keys set here replace [parse]'s for this side only
# loss = '^\\| *(?P<step>\\d+) \\| *(?P<loss>[-+.\\w]+)'
'''
