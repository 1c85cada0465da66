"""Protocol definitions (protocols/*.toml) as typed data.

Every threshold and limit ladder applies comes from here: the models carry no defaults on purpose,
so a value missing from a protocol file is an error rather than a number hidden in code.
"""

from __future__ import annotations

import tomllib
from importlib import resources
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict

from ladder._util.errors import LadderError, SpecError
from ladder._util.validation import deep_merge, validate_or_raise

# The top-level protocols/ directory, installed as the package `ladder.protocols` (pyproject package-dir).
PROTOCOLS_DIR = Path(str(resources.files("ladder.protocols")))


class _Section(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class ShortRun(_Section):
    min_steps: int


class Timeout(_Section):
    factor: float


class L1Rules(_Section):
    rule: Literal["calibrated", "fixed"]
    window_fraction: float
    loss_rel_tol: float
    metric_rel_tol: float
    trend_segments: int
    trend_flat_tol: float
    trend_near_flat: float
    random_repeat_calls: int
    batch_repeat_excess: float = 0.05
    items_rel_tol: float = 0.1
    noise_ratio_max: float = 4.0
    noise_min_points: int = 30
    after_update_share: float = 0.5
    after_update_min_steps: int = 10
    eval_inputs_floor: float = 0.01
    eval_inputs_factor: float = 3.0
    same_seed_start_tol: float
    same_seed_max_drift: float
    same_seed_factor: float
    same_seed_floor: float


class CalibratedRules(_Section):
    min_seeds: int
    alpha: float
    max_seeds: int
    smoothing_fraction: float
    curve_segments: int
    loss_floor_rel: float
    metric_floor_rel: float
    curve_floor_rel: float
    loss_margin_rel: float
    metric_margin_rel: float
    curve_margin_rel: float
    grad_norm_margin_rel: float
    grad_norm_skip_fraction: float
    eval_skip_fraction: float = 0.2  # evaluations in the first share of steps are not judged one by one (the init)
    eval_margin_rel: float = 0.25  # ... and a difference smaller than this share of the seeds' mean never fails


class L2Rules(_Section):
    warmup_steps: int
    warmup_fraction: float
    max_late_compile_steps: int
    # training steps that build graphs at all, beyond the reference's: a graph per slot of a cycle is not a warm-up
    max_warmup_graph_steps: int = 8
    fallback_allow: list[str]
    host_sync_ops: list[str]
    host_read_slack: float
    host_read_margin: float
    host_read_steps_per_call: float  # a step call covering at least this many logged steps (a scan over
    # stacked batches) is judged per logged step
    optimizer_ignore: list[str]
    lr_rel_tol: float = 0.01  # the learning rate at a step differs beyond this (relative), one step's shift allowed
    lr_steps_share: float = 0.01  # ... at more than this share of the steps (and more than one): a changed rate
    # a clip written by hand leaves the norm at max_norm where it binds: at under this share of the steps where the
    # reference's clip bound, the norms the port's optimizer received are clipped some other way (per device)
    clip_at_max_share: float = 0.25
    # the share of the optimizer's parameter elements a global-norm clip is given, port vs reference: beyond this
    # (absolute) the clip covers other parameters (an exhausted generator of parameters clips nothing)
    clip_coverage_tol: float = 0.01
    # a coupled weight decay added to the gradient by hand after the clip: each recorded step's norms must fit
    # |g|^2 = n^2 + 2c<g, theta> - c^2|theta|^2 within this (relative), and miss it without the decay at half of them
    decay_fit_tol: float = 1e-5
    eval_mode_steps_share: float = 0.02  # training steps in eval mode beyond the reference's share by this: a fault
    stale_grad_steps_share: float = 0.02  # steps whose gradient still holds the previous step's (no zero_grad)
    # beyond the reference's share by this: the update adds up every earlier gradient
    eval_items_must_match: bool


class L3Rules(_Section):
    metric_rel_tol: float
    hidden_target: str


class L4Rules(_Section):
    require_faster: bool
    require_cheaper: bool
    skip_first_intervals: int
    min_speedup: float
    max_cost_ratio: float


class AgentRules(_Section):
    session_minutes: float
    max_turns: int
    max_budget_usd: float
    sandbox: Literal["auto", "bwrap", "none"]


class ParityTolerance(_Section):
    """How close two sides' tensors must be, for one numeric regime (fp32 on CPU, bf16, TPU)."""

    output_rtol: float  # every output element: |target - reference| <= output_atol + output_rtol * |reference|
    output_atol: float
    loss_rtol: float
    grad_rel: float  # ||target - reference|| / ||reference|| of each parameter's gradient
    grad_min_cos: float
    param_rel: float  # after K steps: ||target - reference|| / ||reference update|| of each parameter
    param_min_cos: float  # cosine of the two sides' updates (parameters after K steps minus the initial ones)


class ParityRules(_Section):
    steps: int  # K: optimizer steps on the reference's fixed batches, dropout off
    timeout_minutes: float  # each side's run
    tolerances: dict[str, ParityTolerance]
    load_back_metric_rel_tol: float  # weights_load_back: the reference's metric on the port's weights vs the port's


class GradeRules(_Section):
    stage2_allowed: list[str]  # globs a frozen second stage may change; {entry} is the spec's [grade].entry
    metric_literal_digits: int  # a literal in the diff equal to the metric to this many significant digits
    judge_model: str
    judge_rubric: str  # relative to the protocols directory
    judge_max_tokens: int


class Limits(_Section):
    max_attempts_without_l0: int
    max_hours_without_l0: float
    max_full_run_hours: float


class Infrastructure(_Section):
    """Remote runners: what a failure of the machine or the connection (never of the port) is allowed."""

    max_retries: int
    reconnect_tries: int
    reconnect_backoff_s: float
    reconnect_backoff_max_s: float
    keepalive_s: float


class Protocol(_Section):
    name: str
    description: str
    short_run: ShortRun
    timeout: Timeout
    l1: L1Rules
    calibrated: CalibratedRules
    l2: L2Rules
    l3: L3Rules
    l4: L4Rules
    limits: Limits
    agent: AgentRules
    parity: ParityRules
    grade: GradeRules
    infrastructure: Infrastructure
    source_path: str = ""  # where it was loaded from (provenance, not a threshold)


def resolve_protocol_path(name_or_path: str, base_dir: Path | None = None) -> Path:
    candidates = []
    p = Path(name_or_path)
    if p.suffix == ".toml":
        candidates += [p] if p.is_absolute() else [(base_dir or Path.cwd()) / p, PROTOCOLS_DIR / p.name]
    else:
        if base_dir is not None:
            candidates.append(base_dir / "protocols" / f"{name_or_path}.toml")
        candidates.append(PROTOCOLS_DIR / f"{name_or_path}.toml")
    for c in candidates:
        if c.exists():
            return c.resolve()
    known = sorted(x.stem for x in PROTOCOLS_DIR.glob("*.toml"))
    raise LadderError(
        f"protocol {name_or_path!r} not found (looked in {', '.join(str(c) for c in candidates)})",
        f"use one of {known} or a path to a .toml file",
    )


def load_protocol(name_or_path: str = "ncsu", overrides: dict[str, Any] | None = None,
                  base_dir: Path | None = None) -> Protocol:
    path = resolve_protocol_path(name_or_path, base_dir)
    try:
        data = tomllib.loads(path.read_text())
    except tomllib.TOMLDecodeError as e:
        raise SpecError(str(path), [("<file>", "", f"not valid TOML: {e}")]) from None
    if overrides:
        data = deep_merge(data, overrides)
    data["source_path"] = str(path)
    return validate_or_raise(Protocol, data, str(path) + (" (with the spec's overrides)" if overrides else ""))
