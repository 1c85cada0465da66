"""The versioned record of one captured run (run.json) and its parts.

These are data, written once. A record read back with an unknown schema version is refused
rather than guessed at. Nothing here runs anything.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ladder._util.errors import LadderError

RUN_SCHEMA = 1
RunKind = Literal["short", "full", "parity", "evaluate"]  # parity, evaluate: a side of ladder.parity


class LossPoint(BaseModel):
    # NaN/Inf losses are evidence: keep them as "NaN"/"Infinity" strings in standard JSON.
    model_config = ConfigDict(ser_json_inf_nan="strings")

    step: int
    loss: float
    t: float  # seconds since the run started (same clock as the probe's timestamps)


class EvalPoint(BaseModel):
    model_config = ConfigDict(ser_json_inf_nan="strings")  # a NaN evaluation value is evidence, kept as "NaN"

    t: float
    step: int | None = None
    items: int | None = None
    values: dict[str, float] = Field(default_factory=dict)


class Provenance(BaseModel):
    source: str
    git_commit: str | None = None
    git_dirty: bool = False
    uncommitted_sha256: str | None = None  # hash of `git diff HEAD` plus untracked files
    packages: list[str] = Field(default_factory=list)  # `pip freeze` of the profile's environment
    python: str = ""
    hostname: str = ""


INFRASTRUCTURE_KINDS = ("connection_lost", "preempted", "remote_lost", "env_build_failed", "launch_failed")


class InfrastructureFailure(BaseModel):
    """The machine or the connection failed, not the code under test: a remote runner's connection, machine or
    environment; locally, the collectives of fake CPU devices starved by a loaded machine."""

    kind: Literal["connection_lost", "preempted", "remote_lost", "env_build_failed", "launch_failed",
                  "collectives_starved"]
    detail: str


class RemoteRun(BaseModel):
    """Where a remote runner kept the run, and what it cost to keep it there."""

    runner: Literal["ssh", "skypilot"]
    host: str  # the ssh host (alias) or the SkyPilot cluster
    hostname: str = ""  # what the machine calls itself
    run_dir: str  # the run's directory on that machine
    job_id: int | None = None  # SkyPilot's job
    # started_at, ended_at, the line times and the probe's times are all that machine's clock (one clock, so
    # they agree with each other); this is how far it is from ladder's: remote minus local, from the fastest
    # of a few round trips (half the round trip is the uncertainty).
    clock_offset_s: float | None = None
    clock_rtt_s: float | None = None
    reconnects: int = 0
    timings: dict[str, float] = Field(default_factory=dict)  # seconds: connect, env, sync, start, collect
    price_source: str = ""  # "profile" or "skypilot catalog: ..."


class RunRecord(BaseModel):
    """Everything ladder knows about one captured run. Stored as run.json in its run directory."""

    model_config = ConfigDict(ser_json_inf_nan="strings")

    schema_version: int = RUN_SCHEMA
    run_id: str
    kind: RunKind
    profile: str
    platform: str
    seed: int
    command: str
    cwd: str
    started_at: float  # epoch seconds
    ended_at: float | None = None
    exit_code: int | None = None
    timed_out: bool = False
    killed: bool = False  # killed by a signal from outside (not the timeout)
    timeout_s: float
    loss_curve: list[LossPoint] = Field(default_factory=list)
    curve_stride: int = 1  # >1 when a very long curve was decimated to bound memory
    loss_lines: int = 0  # loss lines seen (before decimation)
    nonfinite_losses: list[LossPoint] = Field(default_factory=list)
    evals: list[EvalPoint] = Field(default_factory=list)
    metric_name: str = ""
    metric: float | None = None
    metric_direction: Literal["max", "min"] = "max"
    error_lines: list[str] = Field(default_factory=list)  # lines that look like errors (first few)
    first_lines: list[str] = Field(default_factory=list)  # shown when a pattern matched nothing
    last_lines: list[str] = Field(default_factory=list)
    line_count: int = 0
    log_files: dict[str, str] = Field(default_factory=dict)  # stream -> file name in the run dir
    provenance: Provenance
    price_per_hour: float = 0.0
    chips: int = 1
    probe: dict[str, Any] | None = None  # merged probe reports (ladder.runs.probe_report)
    sandbox: str = "none"  # "bwrap" when the run could see only its own directory, environment and mounts
    integrity: list[str] = Field(default_factory=list)  # protected files that changed while the run ran
    runner: str = "local"
    remote: RemoteRun | None = None  # set by the ssh and skypilot runners
    infrastructure: InfrastructureFailure | None = None  # not the port's failure: the machine's or the connection's
    notes: list[str] = Field(default_factory=list)

    @property
    def wall_s(self) -> float | None:
        return None if self.ended_at is None else self.ended_at - self.started_at

    def save(self, run_dir: Path) -> Path:
        path = run_dir / "run.json"
        tmp = path.with_suffix(".json.tmp")
        tmp.write_text(self.model_dump_json(indent=1))
        tmp.replace(path)
        return path

    @classmethod
    def load(cls, run_dir: Path) -> "RunRecord":
        path = run_dir / "run.json" if run_dir.is_dir() else run_dir
        if not path.exists():
            raise LadderError(f"no run.json in {run_dir}", "pass a run directory written by `ladder run`")
        data = json.loads(path.read_text())
        version = data.get("schema_version")
        if version != RUN_SCHEMA:
            raise LadderError(
                f"{path}: run schema version {version!r}, this ladder reads {RUN_SCHEMA}",
                "re-run with this ladder version or upgrade ladder",
            )
        return cls.model_validate(data)
