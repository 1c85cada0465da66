"""Run the PyTorch/XLA port in-process and report its compilation and CPU-fallback counters.

Usage: PJRT_DEVICE=CPU /tmp/envs/xla/bin/python examples/classifier/xla_metrics.py [train.py args]

After every line the port prints, the number of XLA compilations so far is
recorded, so the report shows at which step compilation stopped. Any `aten::`
counter other than _local_scalar_dense / nonzero is a CPU fallback.
"""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent / "ports" / "xla"))

import torch_xla.debug.metrics as met  # noqa: E402

import train  # noqa: E402

EXPECTED_ATEN = {"aten::_local_scalar_dense", "aten::nonzero"}


def _compiles() -> int:
    data = met.metric_data("CompileTime")
    return int(data[0]) if data else 0


class _Recorder(io.TextIOBase):
    """Pass lines through to real stdout and note the compile count after each one."""

    def __init__(self) -> None:
        self.marks: list[tuple[str, int]] = []
        self._buf = ""

    def write(self, s: str) -> int:
        sys.__stdout__.write(s)
        self._buf += s
        while "\n" in self._buf:
            line, self._buf = self._buf.split("\n", 1)
            self.marks.append((line, _compiles()))
        return len(s)


def main() -> None:
    recorder = _Recorder()
    sys.stdout = recorder
    try:
        train.main(sys.argv[1:])
    finally:
        sys.stdout = sys.__stdout__
    aten = {name: met.counter_value(name) for name in met.counter_names() if name.startswith("aten::")}
    report = {
        "compiles_after_line": [[line.split(" loss")[0], n] for line, n in recorder.marks],
        "compiles_total": _compiles(),
        "execute_count": int((met.metric_data("ExecuteTime") or [0])[0]),
        "aten_counters": aten,
        "cpu_fallbacks": {k: v for k, v in aten.items() if k not in EXPECTED_ATEN},
    }
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
