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


class L2Rules(_Section):
    warmup_steps: int
    warmup_fraction: float
    max_late_compile_steps: int
    fallback_allow: list[str]
    host_sync_ops: list[str]
    host_read_slack: float
    host_read_margin: float
    optimizer_ignore: list[str]
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
