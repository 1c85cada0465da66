"""Shared fixtures: real interpreters for the reference (torch CPU) and target (XLA, JAX) stacks.

The target environments are built on demand by ladder's own environment cache (the same setup
commands as the example's ladder.toml, so tests, the demo and users share one build). Setting
LADDER_XLA_PYTHON / LADDER_JAX_PYTHON points the tests at an existing interpreter instead.
"""

from __future__ import annotations

import os
import sys
import tomllib
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "classifier"


def _profile_setup(profile: str, spec_name: str) -> tuple[list[str], str]:
    spec = tomllib.loads((EXAMPLE / spec_name).read_text())
    prof = spec["profiles"][profile]
    return prof["setup"], prof.get("python", "{env}/bin/python")


def _target_python(var: str, spec_name: str) -> str:
    if os.environ.get(var):
        return os.environ[var]
    from ladder.runs.envs import ensure_env

    setup, python = _profile_setup("target", spec_name)
    return ensure_env(setup, python).python


@pytest.fixture(scope="session")
def torch_python() -> str:
    return sys.executable


@pytest.fixture(scope="session")
def xla_python() -> str:
    return _target_python("LADDER_XLA_PYTHON", "ladder.toml")


@pytest.fixture(scope="session")
def jax_python() -> str:
    return _target_python("LADDER_JAX_PYTHON", "ladder-jax.toml")


@pytest.fixture(autouse=True)
def _isolated_home(tmp_path_factory, monkeypatch):
    # Keep each test's ladder cache for runs away from the user's, but share the env cache:
    # rebuilding a 4 GB environment per test would be absurd.
    monkeypatch.setenv("LADDER_NO_COLOR", "1")
    yield
