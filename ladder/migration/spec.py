"""The migration spec (`ladder.toml`): what to run, how to read its output, and where.

Loading validates everything and reports every problem at once (key, value, fix). Paths in the spec
are relative to the spec file's directory, which is also the migration workspace: ladder writes
`baselines/<name>/`, `journals/<name>/` and `runs/` there.
"""

from __future__ import annotations

import re
import string
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from ladder._util.errors import LadderError, SpecError
from ladder._util.validation import validate_or_raise

PLATFORMS = ("cpu", "cuda", "mps", "xla", "tpu", "jax-cpu", "jax-gpu", "jax-tpu")
BUILTIN_PLACEHOLDERS = {"python", "seed", "run_dir", "steps"}
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


class ParseSpec(_Model):
    loss: str = Field(description="regex with named groups `step` and `loss`, or `epoch`, `batch` (and optionally "
                                  "`batches`, the batches per epoch) and `loss`")
    metric: str = Field(description="regex with a named group `value` for the headline metric")
    metric_name: str = "metric"
    direction: Literal["max", "min"]
    eval: str | None = Field(default=None, description="regex for evaluation lines; numeric named groups are kept")
    error: str = DEFAULT_ERROR_PATTERN

    @field_validator("loss")
    @classmethod
    def _loss(cls, v: str) -> str:
        _compile(v, {"loss"}, "loss")
        groups = set(re.compile(v).groupindex)
        if "step" not in groups and not {"epoch", "batch"} <= groups:
            raise ValueError("the loss pattern needs a named group `step`, or `epoch` and `batch` (with `batches`, "
                             "the batches per epoch, when the line prints it), e.g. (?P<step>\\d+)")
        return v

    @field_validator("metric")
    @classmethod
    def _metric(cls, v: str) -> str:
        return _compile(v, {"value"}, "metric")

    @field_validator("eval", "error")
    @classmethod
    def _any(cls, v: str | None) -> str | None:
        return None if v is None else _compile(v, set(), "eval/error")


class Experiment(_Model):
    short: str = Field(description="command of the short run; placeholders {python} {seed} {run_dir} {steps} and vars")
    full: str
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

    @field_validator("platform")
    @classmethod
    def _platform(cls, v: str) -> str:
        if v not in PLATFORMS:
            raise ValueError(f"unknown platform; use one of {', '.join(PLATFORMS)}")
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

    # Set by load_spec, not read from the file.
    path: Path | None = Field(default=None, exclude=True)

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

    def command(self, kind: str) -> str:
        return self.experiment.short if kind == "short" else self.experiment.full

    def steps(self, kind: str) -> int:
        return self.experiment.short_steps if kind == "short" else self.experiment.full_steps

    def expected_minutes(self, kind: str) -> float:
        return self.experiment.expected_minutes_short if kind == "short" else self.experiment.expected_minutes_full


def _placeholders(cmd: str) -> set[str]:
    try:
        return {f for _, f, _, _ in string.Formatter().parse(cmd) if f}
    except ValueError:
        return {"<unbalanced braces>"}


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
    for kind in ("short", "full"):
        cmd = exp.get(kind)
        if not isinstance(cmd, str):
            continue
        for name, prof in profiles.items():
            pvars = set(prof.get("vars", {}) or {}) if isinstance(prof, dict) else set()
            unknown = _placeholders(cmd) - BUILTIN_PLACEHOLDERS - exp_vars - pvars
            if unknown:
                problems.append((f"experiment.{kind}", cmd,
                                 f"placeholders {sorted(unknown)} are not defined for profile {name!r}: "
                                 f"add them to [experiment.vars] or [profiles.{name}.vars]"))
    for name, prof in profiles.items():
        if isinstance(prof, dict) and prof.get("python") and prof.get("setup") and "{env}" not in prof["python"]:
            problems.append((f"profiles.{name}.python", prof["python"],
                             "with `setup`, python must name the built interpreter, e.g. '{env}/bin/python'"))
    return problems


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

    load_protocol(spec.protocol, spec.protocol_overrides or None, base)
    return spec


def load_spec_protocol(spec: Spec):  # -> Protocol
    from ladder.migration.protocol import load_protocol

    return load_protocol(spec.protocol, spec.protocol_overrides or None, spec.workspace)


TEMPLATE = '''# ladder.toml: how ladder runs and reads your training repo, before and after the port.
# Check it with `ladder run --on reference --kind short`; every problem is reported at once.

name = "my-migration"            # names baselines/<name>/ and journals/<name>/
source = "."                     # the repo to port, relative to this file
protocol = "ncsu"                # protocols/ncsu.toml (fixed 5%/1% rule) or "xstack"

# Override any protocol value, e.g. a looser loss tolerance:
# [protocol_overrides.l1]
# loss_rel_tol = 0.05

[experiment]
# Placeholders: {python} (the profile's interpreter), {seed}, {steps}, {run_dir}, and any var below.
short = "{python} train.py --seed {seed} --steps {steps} --device {device}"
full = "{python} train.py --seed {seed} --steps {steps} --device {device}"
short_steps = 200                # the protocol asks for >= 200 steps
full_steps = 2000
expected_minutes_short = 2       # the timeout is protocol.timeout.factor (10) x this
expected_minutes_full = 30

[parse]
# Regular expressions matched against every output line (stdout and stderr).
loss = 'step (?P<step>\\d+) loss (?P<loss>\\S+)'
metric = 'metric test_acc=(?P<value>\\S+)'
metric_name = "test_acc"
direction = "max"                # "max" if higher is better, else "min"
eval = 'eval step (?P<step>\\d+) items (?P<items>\\d+)'   # optional

[profiles.reference]             # the old hardware
platform = "cpu"                 # cpu, cuda, mps, xla, tpu, jax-cpu, jax-gpu, jax-tpu
python = "python3"               # an interpreter, or `setup` commands (below)
price_per_hour = 1.0
chips = 1
vars = { device = "cpu" }

[profiles.target]                # the new hardware
platform = "xla"
setup = [                        # run once into a cached environment {env}
  "{python} -m venv {env}",
  "{env}/bin/pip install torch==2.9.0 torch-xla==2.9.0",
]
python = "{env}/bin/python"
env = { PJRT_DEVICE = "CPU" }
pass_env = []                    # variables to pass even though they look like secrets
price_per_hour = 1.0
chips = 1
vars = { device = "xla" }
'''
