"""A profile's choice of runner, checked when the spec loads: every problem said at once, with the fix.

Owns the rules that tie `runner` to its table (`[profiles.X.ssh]`, `[profiles.X.skypilot]`), the price
rule (SkyPilot's catalog price may stand in for `price_per_hour`; nothing else may) and what a remote
profile cannot do (`workdir = "inplace"`, mounts relative to the local spec). Must not: connect anywhere.
"""

from __future__ import annotations

import importlib.util
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ladder.migration.spec import Profile

SKYPILOT_INSTALL = "pip install 'ladder[skypilot]'"


def skypilot_missing() -> str | None:
    """Why SkyPilot's SDK cannot be used here (None when it can)."""
    try:
        found = importlib.util.find_spec("sky") is not None
    except (ImportError, ValueError):  # present in sys.modules as None: made unimportable
        found = False
    if not found:
        return f"runner = \"skypilot\" needs SkyPilot's Python SDK, which is not installed: {SKYPILOT_INSTALL}"
    return None


def runner_problems(profile: "Profile") -> list[str]:
    problems = []
    if profile.runner == "ssh" and profile.ssh is None:
        problems.append("runner = \"ssh\" needs an ssh table naming the machine, e.g. ssh = { host = \"gpu-box\" } "
                        "(a host or an alias of ~/.ssh/config)")
    if profile.runner == "skypilot":
        if profile.skypilot is None:
            problems.append("runner = \"skypilot\" needs a skypilot table, e.g. skypilot = { cluster = \"ladder-tpu\", "
                            "accelerators = \"tpu-v5e-8\" }")
        missing = skypilot_missing()
        if missing:
            problems.append(missing)
    if profile.runner != "skypilot" and profile.price_per_hour is None:
        problems.append("price_per_hour is required (the L4 cost check multiplies it by hours and chips)")
    if profile.runner != "local":
        if profile.workdir == "inplace":
            problems.append(f"workdir = \"inplace\" cannot run on another machine ({profile.runner}): use \"copy\"")
        relative = [m for m in profile.mounts if not m.startswith(("/", "~"))]
        if relative:
            problems.append(f"mounts of a {profile.runner} profile are directories on that machine: give absolute "
                            f"paths (not {relative})")
    for name, table in (("ssh", profile.ssh), ("skypilot", profile.skypilot)):
        if table is not None and profile.runner != name:
            problems.append(f"a {name} table is given but runner = \"{profile.runner}\": set runner = \"{name}\" "
                            f"or remove the table")
    return problems
