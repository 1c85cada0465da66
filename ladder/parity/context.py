"""Where the checks find an attempt's parity sides and load-back evaluation (CheckContext.options).

Owns the naming of those directories beside an attempt's runs (`attempt-N-parity/`, `attempt-N-load-back/`)
and the options the parity and weights_load_back checks read. Must not: run or judge anything.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from ladder.migration.spec import Spec
from ladder.parity.runs import SIDES_FILE, ParityRuns

_ATTEMPT_RUN = re.compile(r"^attempt-(\d+)-")


def attempt_dir(runs_dir: Path, attempt: int, what: str) -> Path:
    """`what` is "parity" or "load-back"."""
    return runs_dir / f"attempt-{attempt}-{what}"


def _beside(run_dir: Path, what: str) -> Path | None:
    m = _ATTEMPT_RUN.match(Path(run_dir).name)
    if m is None:
        return None
    d = attempt_dir(Path(run_dir).parent, int(m.group(1)), what)
    marker = SIDES_FILE if what == "parity" else "evaluate.json"
    return d if (d / marker).is_file() else None


def check_options(spec: Spec | None, run_dir: Path, parity_dir: Path | None = None,
                  load_back_dir: Path | None = None) -> dict[str, Any]:
    """Options for a run's parity and weights_load_back checks: absent when the spec asks for neither (the
    checks are then not_applicable), None when asked for but not found (not_checked)."""
    if spec is None or spec.parity is None:
        return {}
    pdir = parity_dir or _beside(run_dir, "parity")
    out: dict[str, Any] = {"parity": ParityRuns.load(pdir).as_option() if pdir else None}
    if spec.parity.export and spec.parity.evaluate:
        ldir = load_back_dir or _beside(run_dir, "load-back")
        out["load_back"] = {"dir": str(ldir)} if ldir else None
    return out
