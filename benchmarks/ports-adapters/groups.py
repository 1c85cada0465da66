"""Per tensor group (outputs, loss, grads, params): how many tensors fail parity and the worst one, for every
port of one program of a finished parity benchmark run (its --work directory). The results JSON keeps only
the first tensor that differs; this shows, e.g., that a gradient fault was or was not clipped away.

Usage: PYTHONPATH=. python3 benchmarks/ports-adapters/groups.py PROGRAM [WORK] [TOLERANCE]
    (WORK defaults to /tmp/ladder-parity-bench, TOLERANCE to fp32-cpu)
"""

from __future__ import annotations

import sys
from pathlib import Path

from ladder.migration.spec import load_spec
from ladder.parity.compare import compare_sides
from ladder.parity.runs import load_spec_protocol


def main() -> None:
    program = sys.argv[1]
    work = Path(sys.argv[2] if len(sys.argv) > 2 else "/tmp/ladder-parity-bench")
    tolerance = sys.argv[3] if len(sys.argv) > 3 else "fp32-cpu"
    spec = load_spec(next((work / "specs").glob(f"{program}-*.toml")))
    tol = load_spec_protocol(spec).parity.tolerances[tolerance]
    ref = work / "runs" / program / "reference"
    for vd in sorted((work / "runs" / program).iterdir()):
        if vd.name == "reference" or not (vd / "target" / "parity.npz").is_file():
            continue
        report = compare_sides(ref, vd / "target", tol, tolerance)
        cells = []
        for group in ("outputs", "loss", "grads", "params"):
            rows = [r for r in report.rows if r.tensor.split("/")[0] == group]
            if not rows:
                continue
            worst = max(rows, key=lambda r: r.rel_diff)
            cells.append(f"{group} {sum(not r.passed for r in rows)}/{len(rows)} fail "
                         f"(worst rel {worst.rel_diff:.2g}, cos {worst.cosine:.4f})")
        print(f"{vd.name}: {'; '.join(cells)}{' | ' + report.problems[0] if report.problems else ''}")


if __name__ == "__main__":
    main()
