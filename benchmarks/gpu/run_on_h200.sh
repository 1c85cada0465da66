#!/usr/bin/env bash
# The GPU check: the example's reference profile on CUDA and its JAX target on the GPU, probe on.
# Runs on a machine whose python3 has torch (CUDA), jax (CUDA), flax and optax but not ladder's
# other dependencies: those come as wheels in .whl/ (pydantic, gitpython and theirs).
# Writes everything under $OUT (or ./gpu-out): run JSONs, check JSONs, a tarball of the run dirs.
set -uo pipefail
OUT=${OUT:-$PWD/gpu-out}
mkdir -p "$OUT"
if [ -d .whl ]; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
  export PYTHONPATH=/tmp/site:$PWD
else
  export PYTHONPATH=$PWD
fi
export LADDER_PLAIN=1
cd examples/classifier
{ nvidia-smi -L; python3 -c "import torch, jax; print('torch', torch.__version__, torch.cuda.get_device_name(0)); print('jax', jax.__version__, jax.devices())"; } > "$OUT/machine.txt" 2>&1
L="python3 -m ladder"
S="--spec ${SPEC:-ladder-gpu.toml}"
check() { # run_json -> check json
  d=$(python3 -c "import json,sys; print(json.load(open(sys.argv[1]))['run_dir'])" "$1")
  $L check "$d" $S --json ${2:-}
}
$L baseline $S --seeds 3 --json > "$OUT/baseline.json" 2> "$OUT/baseline.err"
$L run $S --on target --source ports/jax --json > "$OUT/jax_short.json" 2>> "$OUT/runs.err"
check "$OUT/jax_short.json" > "$OUT/jax_short_check.json"
$L run $S --on target --kind full --source ports/jax --json > "$OUT/jax_full.json" 2>> "$OUT/runs.err"
check "$OUT/jax_full.json" > "$OUT/jax_full_check.json"
# A planted fault, on the GPU: the JAX port with a per-step recompile (migrations/jax/1).
rm -rf /tmp/jax1 && cp -r ports/jax /tmp/jax1 && cp migrations/jax/1/train.py /tmp/jax1/train.py
$L run $S --on target --source /tmp/jax1 --json > "$OUT/jax_recompile.json" 2>> "$OUT/runs.err"
check "$OUT/jax_recompile.json" > "$OUT/jax_recompile_check.json"
tar czf "$OUT/gpu_runs.tgz" --exclude=work baselines runs
ls -la "$OUT"
