#!/usr/bin/env bash
# The probe on a GPU (benchmarks/gpu/probe_gpu.py), as run on the device machine in one call:
#   torch (CUDA), jax (CUDA), flax and optax in its python3; ladder's other needs as wheels in .whl/
#   (pydantic, gitpython and theirs, for Python 3.12); ladder runs from the checkout, not installed.
# Writes under $OUT: machine.txt, log.txt, results.json, report.md, runs.tgz (the run directories, code copies left out).
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site
fi
[ -e ladder/protocols ] || ln -s ../protocols ladder/protocols  # what the installed package maps (pyproject.toml)
{ nvidia-smi -L; nvidia-smi --query-gpu=driver_version,memory.total --format=csv,noheader
  python3 -c "import torch, jax, flax, optax; print('torch', torch.__version__, torch.cuda.get_device_name(0)); print('jax', jax.__version__, jax.devices(), 'flax', flax.__version__, 'optax', optax.__version__)"
} > "$OUT/machine.txt" 2>&1
cat "$OUT/machine.txt"
PYTHONUNBUFFERED=1 timeout "${BUDGET_S:-500}" python3 benchmarks/gpu/probe_gpu.py --out /tmp/probe-gpu --jobs "${JOBS:-4}" 2>&1 | tee "$OUT/log.txt"
cp /tmp/probe-gpu/results.json /tmp/probe-gpu/report.md "$OUT/" 2>/dev/null
tar czf "$OUT/runs.tgz" --exclude=work -C /tmp/probe-gpu ws/runs 2>/dev/null
ls -la "$OUT"
