"""The injected probe itself: it must see what it claims and never change the program it watches."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ladder.runs.probe_report import PROBE_DIR, merge_reports, probe_env, step_at

FIX = Path(__file__).resolve().parent / "fixtures" / "probe"


def _run(python: str, code_or_script: str | Path, tmp: Path, args: list[str] = (), probe: bool = True,
         env: dict | None = None, options: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PJRT_DEVICE": "CPU", **(env or {})}
    if probe:
        full.update(probe_env(tmp / "probe", options))
    cmd = [python, str(code_or_script), *args] if isinstance(code_or_script, Path) else [python, "-c", code_or_script]
    return subprocess.run(cmd, capture_output=True, text=True, env=full, cwd=tmp, timeout=300)


def test_probe_env_puts_the_probe_first_and_keeps_pythonpath(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PYTHONPATH", "/a:/b")
    env = probe_env(tmp_path, {"sample_every": 10})
    assert env["PYTHONPATH"].split(os.pathsep) == [str(PROBE_DIR), "/a", "/b"]
    assert env["LADDER_PROBE_DIR"] == str(tmp_path.resolve())
    assert json.loads(env["LADDER_PROBE_OPTS"]) == {"sample_every": 10}


def test_merge_without_reports_is_none(tmp_path) -> None:
    assert merge_reports(tmp_path / "missing") is None
    assert merge_reports(tmp_path) is None


def test_step_at_maps_times_to_steps_begun() -> None:
    times = [[1, 10.0], [2, 11.0], [3, 12.0]]
    assert [step_at(times, t) for t in (9.0, 10.0, 11.5, 99.0)] == [0, 1, 2, 3]


def test_plain_program_imports_nothing_and_keeps_exit_code_and_output(tmp_path) -> None:
    code = ("import sys; print('loaded', sorted(m for m in ('torch', 'jax', 'torch_xla', 'numpy') if m in sys.modules));"
            "print('err', file=sys.stderr); sys.exit(3)")
    bare, probed = _run(sys.executable, code, tmp_path, probe=False), _run(sys.executable, code, tmp_path)
    assert (probed.returncode, probed.stdout, probed.stderr) == (bare.returncode, bare.stdout, bare.stderr)
    assert probed.returncode == 3 and "loaded []" in probed.stdout
    merged = merge_reports(tmp_path / "probe")
    assert merged is not None and merged["frameworks"] == {} and merged["errors"] == []


def test_shadowed_sitecustomize_still_runs(tmp_path, monkeypatch) -> None:
    other = tmp_path / "site"
    other.mkdir()
    (other / "sitecustomize.py").write_text("import os\nos.environ['SHADOWED_RAN'] = 'yes'\n")
    code = "import os; print(os.environ.get('SHADOWED_RAN'))"
    monkeypatch.setenv("PYTHONPATH", str(other))  # probe_env keeps it after the probe's directory
    p = _run(sys.executable, code, tmp_path)
    assert p.stdout.strip() == "yes", p.stderr
    assert merge_reports(tmp_path / "probe") is not None


@pytest.mark.slow
def test_torch_output_is_identical_with_and_without_probe(tmp_path) -> None:
    # torch.compile with a recompile: the probe turns on dynamo's recompile logs, which must stay silent
    args = ["--compile", "--fault", "recompile", "--steps", "24"]
    bare = _run(sys.executable, FIX / "torch_train.py", tmp_path, args, probe=False)
    probed = _run(sys.executable, FIX / "torch_train.py", tmp_path, args)
    assert probed.returncode == bare.returncode == 0, probed.stderr
    assert probed.stdout == bare.stdout
    assert probed.stderr == bare.stderr
    merged = merge_reports(tmp_path / "probe")
    assert merged["compiles"]["dynamo_recompiles"] == 1
    assert merged["optimizers"][0]["name"] == "SGD" and merged["optimizer_steps"] == 24


@pytest.mark.slow
def test_children_write_their_own_reports(tmp_path) -> None:
    code = textwrap.dedent("""
        import multiprocessing as mp, subprocess, sys
        def work():
            import torch
            torch.nn.Linear(2, 2)(torch.ones(1, 2))
        if __name__ == "__main__":
            subprocess.run([sys.executable, "-c", "import torch; torch.nn.Linear(2, 2)(torch.ones(1, 2))"], check=True)
            for method in ("fork", "spawn"):
                p = mp.get_context(method).Process(target=work)
                p.start(); p.join()
                assert p.exitcode == 0
    """)
    script = tmp_path / "parent.py"
    script.write_text(code)
    p = _run(sys.executable, script, tmp_path)
    assert p.returncode == 0, p.stderr
    merged = merge_reports(tmp_path / "probe")
    pids = {r["pid"] for r in merged["processes"]}
    # parent, subprocess, fork child, spawn child, and spawn's resource tracker
    assert len(pids) == 5, [r["argv"] for r in merged["processes"]]
    assert sum((r.get("torch") or {}).get("forward_samples", 0) > 0 for r in merged["processes"]) == 3


def test_a_forked_child_frees_nothing_the_parent_probe_held(tmp_path) -> None:
    # round 16's regress/xla_worker_shards: DataLoader workers forked mid-training deadlocked on their first
    # statement (both full runs, 0% CPU for 8 minutes; gdb: a worker's after-fork callback freeing an XLA tensor,
    # whose destructor waits on torch_xla's graph-executor mutex, held by another thread of the parent at the fork).
    # The probe's after-fork reset dropped what the parent held, gradient norms kept on the device among it. Nothing
    # the parent's probe held may be freed in the child: a sentinel whose __del__ prints stands for the tensor
    code = textwrap.dedent("""
        import gc, os
        import _ladder_probe as core
        PARENT = os.getpid()
        class Sentinel:
            def __del__(self):
                if os.getpid() != PARENT:
                    print("freed in the child", flush=True)
        core.grad_norms.values.append((1, Sentinel()))
        core.report["optimizers"].append({"kept on the device": Sentinel()})
        pid = os.fork()
        if pid == 0:
            gc.collect()
            print("child ran", flush=True)
            os._exit(0)
        os.waitpid(pid, 0)
        print("parent", len(core.grad_norms.values), flush=True)
    """)
    p = _run(sys.executable, code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "child ran" in p.stdout and "parent 1" in p.stdout, p.stdout + p.stderr
    assert "freed in the child" not in p.stdout, p.stdout


def test_batch_fingerprints_read_host_tensors_of_any_dtype_without_counting_a_read(tmp_path) -> None:
    # the fingerprint reads a CPU tensor through torch's own numpy (the probe's counted `.numpy()` is not the
    # program's read), bfloat16 as int16 and a tensor that requires grad included; equal values give equal parts,
    # another value another part; inputs are sampled to MAX_SAMPLE elements, strided over the whole input
    code = textwrap.dedent("""
        import torch
        import _ladder_probe as core
        from _ladder_probe import batches
        x = torch.randn(64, 16)
        big = torch.arange(10 ** 6, dtype=torch.float32)
        late = big.clone()
        late[976 * 500] = -1.0  # an element the strided sample holds (stride 10**6 // 1024 = 976)
        cases = []
        for t in (x, x.bfloat16(), x.double(), x.clone().requires_grad_(), x.t(), x[:, ::2]):
            c = t.detach().clone()
            with torch.no_grad():
                c[0, 0] += 1
            cases.append((t, t.detach().clone(), c))
        before = core.reads.total
        for t, same, other in cases:
            a = batches.torch_part(t)
            assert a is not None and a == batches.torch_part(same) and a != batches.torch_part(other), t.dtype
        part = batches.torch_part(big)
        assert len(part) < 4 * batches.MAX_SAMPLE + 100, len(part)
        assert batches.torch_part(late) != part
        print("reads", core.reads.total - before)
    """)
    p = _run(sys.executable, code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert "reads 0" in p.stdout, p.stdout


def test_input_moments_are_exact_for_data_far_from_zero(tmp_path) -> None:
    # the evaluation-inputs relation compares each feature's mean in its deviations: raw features near 1000 with
    # deviations 1 to 8 must keep their means and deviations to well under 1e-4 of a deviation, whichever road the
    # rows come by (float32 batches summed in float32 about a shift, a device copy's float64 sums, a float64 batch)
    code = textwrap.dedent("""
        import numpy as np
        from _ladder_probe import batches
        rng = np.random.default_rng(0)
        data = (rng.standard_normal((3000, 8)) * np.arange(1, 9) + 1000).astype(np.float32)
        batches.note_moments([data[:100]], [None], "train")
        batches.note_moments([batches._sums(data[100:1100])], [None], "train")
        batches.note_moments([data[1100:].astype(np.float64)], [None], "train")
        batches.note_moments([data[:64]], [None], "eval", "f", 0)  # before the first training step: left out
        out = batches._moments_out()
        d = data.astype(np.float64)
        m = out["train:8"]
        print(sorted(out), m["rows"], np.max(np.abs(np.array(m["mean"]) - d.mean(0)) / d.std(0)),
              np.max(np.abs(np.array(m["sd"]) / d.std(0) - 1)))
    """)
    p = _run(sys.executable, code, tmp_path)
    assert p.returncode == 0, p.stderr
    keys, rows, mean_err, sd_err = p.stdout.rsplit("]", 1)[0] + "]", *p.stdout.rsplit("]", 1)[1].split()
    assert keys == "['train:8']" and rows == "3000", p.stdout
    assert float(mean_err) < 1e-4 and float(sd_err) < 1e-4, p.stdout


@pytest.mark.slow
def test_probe_errors_are_recorded_not_raised(tmp_path) -> None:
    # a bad option makes the probe fail when torch loads; training must not notice
    args = ["--steps", "12"]
    bare = _run(sys.executable, FIX / "torch_train.py", tmp_path, args, probe=False)
    probed = _run(sys.executable, FIX / "torch_train.py", tmp_path, args,
                  options={"forward_calls_per_sample": "often"})
    assert probed.returncode == 0 and probed.stdout == bare.stdout, probed.stderr
    errors = merge_reports(tmp_path / "probe")["errors"]
    assert any("hook torch: ValueError" in e for e in errors), errors


@pytest.mark.slow
def test_param_nonfinite_option_finds_nan_weights(tmp_path) -> None:
    p = _run(sys.executable, FIX / "torch_train.py", tmp_path, ["--fault", "nan", "--steps", "12"],
             options={"param_nonfinite": True})
    assert p.returncode == 0, p.stderr
    merged = merge_reports(tmp_path / "probe")
    assert any("Sequential.0.weight" in n for n in merged["nonfinite_params"]), merged["nonfinite_params"]


@pytest.mark.slow
@pytest.mark.xla
def test_xla_metrics_are_read_before_torch_xla_exits(tmp_path, xla_python) -> None:
    # The program prints what torch_xla's metrics say at its end; the probe, reading at exit, must agree.
    code = textwrap.dedent("""
        import torch, torch_xla, torch_xla.debug.metrics as met
        dev = torch_xla.device()
        m = torch.nn.Linear(4, 2).to(dev)
        opt = torch.optim.SGD(m.parameters(), lr=0.1)
        for _ in range(8):
            m(torch.ones(3, 4, device=dev)).sum().backward(); opt.step(); opt.zero_grad(); torch_xla.sync()
        print(met.metric_data("CompileTime")[0], met.counter_value("UncachedCompile"))
    """)
    p = _run(xla_python, code, tmp_path)
    assert p.returncode == 0, p.stderr
    compiles, uncached = map(int, p.stdout.split())
    merged = merge_reports(tmp_path / "probe")
    assert compiles > 0
    assert merged["compiles"]["xla"] == compiles and merged["compiles"]["xla_uncached"] == uncached
    assert merged["platforms"] == {"torch": ["xla"], "xla": ["CPU"], "jax": [], "jax_devices": []}
    assert [e["step"] for e in merged["compile_events"]] == sorted(e["step"] for e in merged["compile_events"])


@pytest.mark.slow
@pytest.mark.jax
def test_jax_compiles_backend_and_devices(tmp_path, jax_python) -> None:
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        f = jax.jit(lambda x: x * 2)
        for n in (1, 2, 2, 3):
            f(jnp.ones(n)).block_until_ready()
        print(len(jax.devices()))
    """)
    p = _run(jax_python, code, tmp_path, env={"XLA_FLAGS": "--xla_force_host_platform_device_count=4"})
    assert p.returncode == 0 and p.stdout.strip() == "4", p.stderr
    merged = merge_reports(tmp_path / "probe")
    fns = [e["function"] for e in merged["compile_events"]]
    assert fns.count("jit(<lambda>)") == 3  # shapes 1, 2, 3; the second call with 2 is cached
    assert merged["platforms"]["jax"] == ["cpu"]
    assert merged["processes"][0]["jax"]["device_count"] == 4


def _grad_norms(tmp: Path) -> list[list[float]]:
    return merge_reports(tmp / "probe")["grad_norms"]["values"]


def test_torch_grad_norms_are_those_the_optimizer_receives(tmp_path) -> None:
    # Clipping binds on odd steps only: the probe must see the clipped gradient, as optimizer.step does.
    code = textwrap.dedent("""
        import torch
        torch.manual_seed(0)
        m = torch.nn.Linear(4, 2)
        opt = torch.optim.Adam(m.parameters(), lr=0.1)
        for i in range(6):
            opt.zero_grad()
            (m(torch.randn(8, 4)) ** 2).sum().backward()
            torch.nn.utils.clip_grad_norm_(m.parameters(), 1.0 if i % 2 else 1e6)
            print(float(torch.sqrt(sum((p.grad ** 2).sum() for p in m.parameters()))),
                  float(torch.sqrt(sum((p ** 2).sum() for p in m.parameters()))),
                  float(sum((p.grad * p).sum() for p in m.parameters())))
            opt.step()
    """)
    p = _run(sys.executable, code, tmp_path, options={"grad_norm_budget": 0})  # every step
    assert p.returncode == 0, p.stderr
    printed = [[float(x) for x in line.split()] for line in p.stdout.splitlines()]
    got = _grad_norms(tmp_path)
    assert [s for s, *_ in got] == [1, 2, 3, 4, 5, 6]
    assert [g for _, g, _, _, _ in got] == pytest.approx([g for g, _, _ in printed], rel=1e-5)
    assert [w for _, _, w, _, _ in got] == pytest.approx([w for _, w, _ in printed], rel=1e-5)  # before the step
    # where a clip ran, <g, theta> too (it tells a weight decay added to the gradient by hand)
    assert [d for *_, d in got] == pytest.approx([d for _, _, d in printed], rel=1e-4, abs=1e-6)
    assert got[1][1] == pytest.approx(1.0, rel=1e-5) and got[0][1] > 1.5  # clipped, and not
    # clip_grad_norm_ returned the norm before clipping: recorded beside, with the threshold
    assert got[1][3] > 1.5 and got[0][3] == pytest.approx(got[0][1], rel=1e-5)
    assert merge_reports(tmp_path / "probe")["grad_norms"]["clip"]["max_norm"] == 1e6
    assert merge_reports(tmp_path / "probe")["grad_norms"]["source"] == "torch optimizer.step"

    (tmp_path / "off").mkdir()
    assert _run(sys.executable, code, tmp_path / "off", options={"grad_norms": False}).stdout == p.stdout
    assert merge_reports(tmp_path / "off" / "probe")["grad_norms"] is None  # the option turns it off


@pytest.mark.slow
@pytest.mark.jax
def test_a_wrapped_jit_keeps_its_ahead_of_time_methods_and_attributes(tmp_path, jax_python) -> None:
    # the probe's jit wrapper hands ahead-of-time use (lower, eval_shape) to the program's own jitted function,
    # and forwards its other attributes, so programs that inspect or compile ahead of time run unchanged
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp
        step = jax.jit(lambda x: (x * 2.0).sum())
        x = jnp.ones((4, 3))
        print(step.lower(x).compile()(x), step.eval_shape(x).shape, callable(step.clear_cache))
    """)
    p = _run(jax_python, code, tmp_path)
    assert p.returncode == 0, p.stderr
    assert p.stdout.split() == ["24.0", "()", "True"], p.stdout


@pytest.mark.slow
@pytest.mark.jax
def test_optax_grad_norms_are_the_input_of_the_outermost_transformation(tmp_path, jax_python) -> None:
    # optax.chain(clip, adam): the probe measures where the whole chain receives the gradient, inside jit;
    # as for torch, the series is what the optimizer receives after a leading global-norm clip, and the norm
    # before the clip is kept beside it.
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, optax
        tx = optax.chain(optax.clip_by_global_norm(1.0), optax.adam(0.1))
        params = {"w": jnp.ones((4, 2)), "b": jnp.zeros(2)}
        state = tx.init(params)
        loss = lambda p, x: ((x @ p["w"] + p["b"]) ** 2).sum()
        @jax.jit
        def step(p, s, x):
            g = jax.grad(loss)(p, x)
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s, optax.global_norm(g), optax.global_norm(p)
        for i in range(5):
            x = jax.random.normal(jax.random.PRNGKey(i), (8, 4)) * (0.01 if i % 2 else 1.0)
            params, state, n, w = step(params, state, x)
            print(float(n), float(w))
    """)
    p = _run(jax_python, code, tmp_path)
    assert p.returncode == 0, p.stderr
    printed = [[float(x) for x in line.split()] for line in p.stdout.splitlines()]
    raw = [g for g, _ in printed]
    got = _grad_norms(tmp_path)
    assert [g[0] for g in got] == [1, 2, 3, 4, 5]
    assert [g[1] for g in got] == pytest.approx([min(r, 1.0) for r in raw], rel=1e-4)
    assert [g[3] for g in got] == pytest.approx(raw, rel=1e-4)
    assert [g[2] for g in got] == pytest.approx([w for _, w in printed], rel=1e-4)
    assert any(r > 1.0 for r in raw) and any(r < 1.0 for r in raw)  # both sides of the clip happened
    gn = merge_reports(tmp_path / "probe")["grad_norms"]
    assert gn["source"] == "optax update (outermost transformation)" and gn["clip"]["max_norm"] == 1.0, gn



@pytest.mark.slow
@pytest.mark.jax
def test_a_jax_that_hides_its_trace_is_named_as_unsupported_for_norms(tmp_path, jax_python) -> None:
    # Older JAX (0.4.30) has no jax._src.core.unsafe_get_current_trace: the probe cannot tell the step's own
    # trace, so it records no norms. The reason must say so, not blame a nested transformation.
    code = textwrap.dedent("""
        import jax, jax.numpy as jnp, optax
        from jax._src import core
        del core.unsafe_get_current_trace   # as on a JAX older than the probe supports
        tx = optax.adam(0.1)
        params = {"w": jnp.ones((4, 2))}
        state = tx.init(params)
        @jax.jit
        def step(p, s, x):
            g = jax.grad(lambda p: ((x @ p["w"]) ** 2).sum())(p)
            u, s = tx.update(g, s, p)
            return optax.apply_updates(p, u), s
        for i in range(3):
            params, state = step(params, state, jnp.ones((8, 4)))
        print("done")
    """)
    p = _run(jax_python, code, tmp_path)
    assert p.returncode == 0 and p.stdout.strip() == "done", p.stderr
    gn = merge_reports(tmp_path / "probe")["grad_norms"] or {}
    assert not gn.get("values"), gn
    why = gn.get("why_missing") or ""
    assert "does not tell the probe the current trace" in why and "nested" not in why, gn

def test_grad_norms_thin_out_only_when_they_would_cost_more_than_the_budget(tmp_path) -> None:
    # Computing the norms costs about as much as a tiny model's step: with a budget of 0.4% of the step time
    # that step cannot afford them at every step (k ~ cost / (budget x step) is about a hundred), while a
    # 50 ms step with a 10% budget (5 ms, room for a loaded machine: at the default 2% a loaded run thinned) can. The fast run's bound holds on a loaded machine too: a
    # step's wall time there grows and k shrinks with it, but a 10x slower step still leaves k >= 2. k is
    # rounded up to a power of two (kept steps are its multiples), so it must stay well below 2000 / 5 / 2
    # for 5 points spread over the run: at 0.1% it reached 1024 under load and kept 3.
    code = textwrap.dedent("""
        import sys, time, torch
        m = torch.nn.Linear(64, 64)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for i in range(int(sys.argv[2])):
            m(torch.ones(2, 64)).sum().backward()
            opt.step()
            opt.zero_grad()
            if sys.argv[1] == "slow":
                time.sleep(0.05)
    """)
    for speed, steps, options in (("fast", 2000, {"grad_norm_budget": 0.004}), ("slow", 200, {"grad_norm_budget": 0.1})):
        (tmp_path / speed).mkdir()
        p = subprocess.run([sys.executable, "-c", code, speed, str(steps)], capture_output=True, text=True,
                           cwd=tmp_path / speed, env={**os.environ, **probe_env(tmp_path / speed / "probe", options)},
                           timeout=300)
        assert p.returncode == 0, p.stderr
    fast, slow = (_grad_norms(tmp_path / s) for s in ("fast", "slow"))
    assert len(slow) == 200, [pt[0] for pt in slow][:40]
    assert 5 <= len(fast) < 1000 and fast[0][0] == 1, [pt[0] for pt in fast][:40]  # thinned, still spread
    assert fast[-1][0] > 1500
    # thinned steps are multiples of a power of two, so runs thinned under other loads share them (k follows
    # the measured cost, so it changes within a run and with the machine's load: 16 and more on an idle
    # machine, 4 on one running two benchmarks beside the tests; how far it thins is not asserted)
    thinned = [pt[0] for pt in fast if pt[0] > 100]
    # (a step the machine stalled on lowers k, down to 1 at the worst: an odd step or two under load; unrounded,
    # k = 3, 5, 19 ... keeps half of its steps odd)
    odd = [s for s in thinned if s % 2]
    assert thinned and len(odd) <= 0.1 * len(thinned), (odd, len(thinned))
