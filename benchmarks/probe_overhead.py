"""What the injected probe costs: step time with and without it, and its start-up and exit cost.

Run:  python benchmarks/probe_overhead.py [--python PY] [--repeats 9] [--steps 400] [--jax-python PY]
Runs with and without the probe alternate (order flipped each repeat) so drift hits both alike; the
ratio reported is the median of the per-pair ratios of median step times. The workload is a small
MLP whose step takes about a millisecond, so a fixed per-step cost shows up rather than hides.
With --jax-python (an interpreter with jax and optax), the same is measured for a jitted JAX step (an
optax Adam update of an MLP of 2 and of 48 hidden layers, a new host batch each step): what the probe adds there is its clock,
the batch fingerprint and shapes of the step's data, and the update samples the step returns beside its
outputs (ladder.checks.replay). Goal: ratio within 1.02.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from ladder.runs.probe_report import probe_env  # noqa: E402

WORKLOAD = """
import sys, time, torch
steps, hidden = int(sys.argv[1]), int(sys.argv[2])
torch.manual_seed(0)
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, hidden), torch.nn.ReLU(), torch.nn.Linear(hidden, hidden),
                            torch.nn.ReLU(), torch.nn.Linear(hidden, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
x, y = torch.randn(64, 64), torch.randn(64, 1)
times = []
for i in range(steps):
    t = time.perf_counter()
    loss = ((model(x) - y) ** 2).mean()
    loss.backward()
    opt.step()
    opt.zero_grad()
    times.append(time.perf_counter() - t)
print(sorted(times[steps // 10:])[len(times[steps // 10:]) // 2])
"""


WORKLOAD_JAX = """
import sys, time
import numpy as np, jax, jax.numpy as jnp, optax
steps, hidden, layers = int(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3])
sizes = [64] + [hidden] * layers + [1]
keys = jax.random.split(jax.random.PRNGKey(0), len(sizes) - 1)
params = [{"w": jax.random.normal(k, (a, b)) * a ** -0.5, "b": jnp.zeros(b)}
          for k, a, b in zip(keys, sizes[:-1], sizes[1:])]
tx = optax.adam(1e-3)
state = tx.init(params)

def loss_fn(p, x, y):
    for layer in p[:-1]:
        x = jax.nn.relu(x @ layer["w"] + layer["b"])
    return jnp.mean((x @ p[-1]["w"] + p[-1]["b"] - y) ** 2)

@jax.jit
def step(p, s, x, y):
    loss, g = jax.value_and_grad(loss_fn)(p, x, y)
    u, s = tx.update(g, s, p)
    return optax.apply_updates(p, u), s, loss

rng = np.random.default_rng(0)
X, Y = rng.standard_normal((4096, 64)).astype(np.float32), rng.standard_normal((4096, 1)).astype(np.float32)
times = []
for i in range(steps):
    t = time.perf_counter()
    b = (i * 64) % (4096 - 64)
    params, state, loss = step(params, state, X[b:b + 64], Y[b:b + 64])
    loss.block_until_ready()
    times.append(time.perf_counter() - t)
print(sorted(times[steps // 10:])[len(times[steps // 10:]) // 2])
"""


def _run(python: str, args: list[str], probe_dir: Path | None) -> tuple[float, str]:
    env = dict(os.environ)
    if probe_dir is not None:
        env.update(probe_env(probe_dir))
    t = time.perf_counter()
    p = subprocess.run([python, *args], capture_output=True, text=True, env=env, check=True)
    return time.perf_counter() - t, p.stdout


HOOK_COST = """
import sys, timeit, torch
core = sys.modules["_ladder_probe"]  # loaded by the injected sitecustomize
from _ladder_probe import torch_facts
torch.set_num_threads(1)
model = torch.nn.Sequential(torch.nn.Linear(64, 128), torch.nn.ReLU(), torch.nn.Linear(128, 128), torch.nn.ReLU(),
                            torch.nn.Linear(128, 1))
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
model(torch.randn(64, 64)).sum().backward()  # gradients present, as at a real step
empty = timeit.timeit(lambda: None, number=1000) / 1000

def step_hooks():
    torch_facts._optimizer_pre_hook(opt, (), {})
    torch_facts._optimizer_post_hook(opt, (), {})

def cost(grad_norms):
    best = []
    for _ in range(7):  # 1000 calls stay in the every-step regime (the first 2000 steps): the costly one
        core.configure(grad_norms=grad_norms, grad_norm_budget=0)  # the raw cost of one recording, every call
        best.append(timeit.timeit(step_hooks, number=1000) / 1000 - empty)
    return min(best)

t = torch.ones(())
core.configure()
read = min(timeit.timeit(t.item, number=20000) / 20000 for _ in range(5))
print(cost(False), cost(True), read)
"""


def _import_ms(python: str, probe_dir: Path) -> float:
    env = {**os.environ, **probe_env(probe_dir)}
    err = subprocess.run([python, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, env=env).stderr
    line = next(x for x in err.splitlines() if x.split("|")[-1].strip() == "sitecustomize")
    return int(line.split("|")[1]) / 1000


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--python", default=sys.executable)
    ap.add_argument("--repeats", type=int, default=9)
    ap.add_argument("--steps", type=int, default=400)
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--jax-python", default=None, help="also measure a jitted JAX step with this interpreter")
    ap.add_argument("--jax-layers", type=int, nargs="+", default=[2, 48],
                    help="hidden layers of the JAX workload, one measurement each (2 leaves a layer)")
    a = ap.parse_args()
    with tempfile.TemporaryDirectory(prefix="probe-bench-") as tmp:
        _bench(a, Path(tmp))
        if a.jax_python:
            _bench_jax(a, Path(tmp) / "jax")


def _pairs(python: str, workload: str, a: argparse.Namespace, tmp: Path,
           extra: tuple[str, ...] = ()) -> tuple[list[float], list[float], list[float]]:
    """Step times with and without the probe, alternating (the order flipped each repeat): (ratios, bare, probed)."""
    ratios, bare_steps, probed_steps = [], [], []
    for r in range(a.repeats):
        order = (False, True) if r % 2 == 0 else (True, False)
        step = {}
        for with_probe in order:
            _, out = _run(python, ["-c", workload, str(a.steps), str(a.hidden), *extra],
                          tmp / f"w{r}" if with_probe else None)
            step[with_probe] = float(out.strip().splitlines()[-1])
        ratios.append(step[True] / step[False])
        bare_steps.append(step[False])
        probed_steps.append(step[True])
    return ratios, bare_steps, probed_steps


def _bench_jax(a: argparse.Namespace, tmp: Path) -> None:
    for layers in a.jax_layers:
        _bench_jax_layers(a, tmp / f"l{layers}", layers)


def _bench_jax_layers(a: argparse.Namespace, tmp: Path, layers: int) -> None:
    ratios, bare_steps, probed_steps = _pairs(a.jax_python, WORKLOAD_JAX, a, tmp, (str(layers),))
    reports = [json.loads(p.read_text()) for p in tmp.glob("w*/probe-*.json")]
    assert len(reports) == a.repeats, "every probed workload run must leave a report"
    samples = statistics.median(sum(len(w["steps"]) for w in (rep.get("update_samples") or {}).get("windows") or [])
                                for rep in reports)
    steps = statistics.median((rep.get("clock") or {}).get("steps") or 0 for rep in reports)
    leaves = 2 * (layers + 1)
    print(f"JAX, {layers} hidden layers ({leaves} parameter leaves): step time without probe: "
          f"{statistics.median(bare_steps) * 1e3:.3f} ms (median of {a.repeats} runs), with probe: "
          f"{statistics.median(probed_steps) * 1e3:.3f} ms")
    print(f"JAX, {layers} hidden layers: step time ratio (with/without), median of per-pair ratios: {statistics.median(ratios):.4f} "
          f"(pairs: {', '.join(f'{x:.3f}' for x in ratios)}; goal <= 1.02); the probe counted {steps:.0f} training "
          f"steps of {a.steps}, update samples kept: {samples:.0f}")


def _bench(a: argparse.Namespace, tmp: Path) -> None:
    ratios, bare_steps, probed_steps = _pairs(a.python, WORKLOAD, a, tmp)
    start_bare: list[float] = []
    start_probed: list[float] = []
    for r in range(a.repeats):
        order = (False, True) if r % 2 == 0 else (True, False)
        for with_probe in order:  # start-up: an empty program, which imports no framework
            wall, _ = _run(a.python, ["-c", "pass"], tmp / f"s{r}" if with_probe else None)
            (start_probed if with_probe else start_bare).append(wall)
    import_ms = statistics.median(_import_ms(a.python, tmp / f"i{r}") for r in range(a.repeats))
    _, out = _run(a.python, ["-c", HOOK_COST], tmp / "hook")
    hook_us, hook_gn_us, read_us = (float(x) * 1e6 for x in out.strip().splitlines()[-1].split())
    reports = [json.loads(p.read_text()) for p in tmp.glob("w*/probe-*.json")]
    assert len(reports) == a.repeats, "every probed workload run must leave a report"
    exit_ms = statistics.median(rep["exit_ms"] for rep in reports)
    install_ms = statistics.median(rep["install_ms"] for rep in reports)
    print(f"step time without probe: {statistics.median(bare_steps) * 1e3:.3f} ms (median of {a.repeats} runs)")
    print(f"step time with probe:    {statistics.median(probed_steps) * 1e3:.3f} ms")
    print(f"step time ratio (with/without), median of per-pair ratios: {statistics.median(ratios):.4f} "
          f"(pairs: {', '.join(f'{x:.3f}' for x in ratios)}; goal <= 1.02)")
    step_us = statistics.median(bare_steps) * 1e6
    print(f"per-step cost measured in-process: optimizer hook {hook_us:.2f} us = {hook_us / step_us * 100:.2f}% of a "
          f"step without gradient norms, {hook_gn_us:.2f} us = {hook_gn_us / step_us * 100:.2f}% when they are "
          "recorded at every step (by default only every k-th step when that would exceed 2% of the step time; "
          "forward hook: off between samples)")
    print(f"a counted host read (tensor.item() through the probe's wrapper): {read_us:.2f} us per call")
    kept = [len((rep.get("grad_norms") or {}).get("values") or []) for rep in reports]
    print(f"gradient norms kept per probed run (of {a.steps} steps, default budget): {statistics.median(kept):.0f}")
    print(f"start-up cost: {(statistics.median(start_probed) - statistics.median(start_bare)) * 1e3:.1f} ms wall "
          f"(python -c pass: {statistics.median(start_bare) * 1e3:.1f} -> {statistics.median(start_probed) * 1e3:.1f} ms); "
          f"import of the probe's sitecustomize {import_ms:.2f} ms (-X importtime), install() {install_ms:.2f} ms")
    print(f"exit cost: {exit_ms:.2f} ms (read counters, encode and write the report; median of {len(reports)})")


if __name__ == "__main__":
    main()
