"""The probe measures the reference and the port the same way, and never changes the program it measures.

Each test runs a real program (torch CPU, PyTorch/XLA on its CPU device, JAX on the CPU) with and without
the probe, or with a fault that really happens, and reads the merged report.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from ladder.checks.l2 import optimizer_diff
from ladder.migration.spec import ParseSpec
from ladder.runs.parse import OutputParser
from ladder.runs.probe_report import merge_reports, probe_env, read_rates
from ladder.runs.records import EvalPoint, Provenance, RunRecord

FIX = Path(__file__).resolve().parent / "fixtures" / "probe"


def _run(python: str, args: list[str], tmp: Path, probe: bool = True, options: dict | None = None,
         env: dict | None = None) -> subprocess.CompletedProcess:
    full = {**os.environ, "PJRT_DEVICE": "CPU", "OMP_NUM_THREADS": "1", **(env or {})}
    if probe:
        full.update(probe_env(tmp / "probe", options))
    tmp.mkdir(parents=True, exist_ok=True)
    p = subprocess.run([python, *args], capture_output=True, text=True, env=full, cwd=tmp, timeout=600)
    assert p.returncode == 0, p.stderr[-3000:]
    return p


def _record(p: subprocess.CompletedProcess, probe_dir: Path, evals: list[EvalPoint] | None = None) -> RunRecord:
    return RunRecord(run_id="r", kind="short", profile="p", platform="cpu", seed=0, command="x", cwd=".",
                     started_at=0.0, ended_at=1.0, exit_code=0, timeout_s=60, evals=evals or [],
                     provenance=Provenance(source="."), probe=merge_reports(probe_dir))


# ---------------------------------------------------------------- the probe changes nothing

@pytest.mark.slow
@pytest.mark.xla
def test_xla_graphs_compile_counts_and_output_are_unchanged_by_the_probe(tmp_path, xla_python) -> None:
    # Gradient norms on, and thinned as hard as the budget allows: keeping fewer values must not change
    # the traced graph (XLA would compile the step twice).
    args = [str(FIX / "xla_graphs.py"), "--device", "xla"]
    bare = _run(xla_python, args, tmp_path / "bare", probe=False)
    probed = _run(xla_python, args, tmp_path / "probed", options={"grad_norm_budget": 1e-6})
    assert probed.stdout == bare.stdout
    assert "compiles" in bare.stdout.splitlines()[-1]
    merged = merge_reports(tmp_path / "probed" / "probe")
    gn = merged["grad_norms"]
    assert len(gn["values"]) >= 10 and all(v[3] is not None for v in gn["values"])  # pre-clip norms too
    assert merged["optimizer_steps"] == 60


@pytest.mark.slow
@pytest.mark.parametrize("device,mode", [("cpu", "module"), ("cpu", "method"),
                                         pytest.param("xla", "module", marks=pytest.mark.xla)])
def test_a_torch_compiled_model_runs_and_compiles_the_same_under_the_probe(tmp_path, device, mode, request) -> None:
    # torch.compile(model) (nanoGPT's habit) and model.compile(): dynamo traces the probe's global forward hook
    # with the model. Round 15 of the corpus found the hook crashing every such run (torch_xla 2.9, openxla), and
    # removing it after sampling recompiled the program's graph (its guard counts global hooks).
    python = request.getfixturevalue("xla_python") if device == "xla" else sys.executable
    args = [str(FIX / "xla_graphs.py"), "--device", device, "--compile", mode]
    bare = _run(python, args, tmp_path / "bare", probe=False)
    probed = _run(python, args, tmp_path / "probed")
    assert probed.stdout == bare.stdout  # the losses, XLA's compile counts and dynamo's frame and graph counts
    assert probed.stderr == bare.stderr  # torch's warning about global hooks under torch.compile is not raised
    assert "dynamo frames {'total': 2" in bare.stdout.splitlines()[-1]  # training and evaluation: really compiled
    merged = merge_reports(tmp_path / "probed" / "probe")
    assert merged["errors"] == []
    torch_facts = merged["processes"][0]["torch"]
    assert torch_facts["modules"] == ["Net"]  # the model, not the compiled wrapper nor the backend's graph modules
    assert set(torch_facts["param_devices"]) == {device}
    assert merged["optimizer_steps"] == 60 and merged["optimizers"][0]["name"] == "AdamW"
    windows = merged["processes"][0]["eval_windows"]
    assert [(w["batches"], w["items"]) for w in windows] == [(4, 256)] * 3  # each batch counted once


def test_torch_order_draws_wrapped_by_the_probe_script_compile_and_draw_the_same(tmp_path) -> None:
    # the probe wraps torch.randperm/randint/multinomial to see a generator never seeded (L1 randomness): a
    # TorchScript function and a torch.compile'd one that call them must still build, draw the same numbers and
    # compile as often as without the probe
    program = tmp_path / "draws.py"
    program.write_text(textwrap.dedent("""
        import torch
        import torch._dynamo.utils as du

        @torch.jit.script
        def scripted(n: int):
            return torch.randperm(n) * 10 + torch.randint(0, 5, (n,))

        def noisy(x):
            return x + torch.randint(0, 5, x.shape).float() + torch.multinomial(torch.ones(4), 4).float()

        torch.manual_seed(3)
        compiled = torch.compile(noisy, backend="eager")
        print(scripted(6).tolist(), compiled(torch.zeros(4)).tolist(), compiled(torch.ones(4)).tolist())
        print(torch.randperm(6, generator=torch.Generator().manual_seed(1)).tolist())
        print("frames", du.counters["frames"]["total"], du.counters["frames"]["ok"])
    """))
    bare = _run(sys.executable, [str(program)], tmp_path / "bare", probe=False)
    probed = _run(sys.executable, [str(program)], tmp_path / "probed")
    assert probed.stdout == bare.stdout and "frames" in bare.stdout, (bare.stdout, probed.stderr[-2000:])
    merged = merge_reports(tmp_path / "probed" / "probe")
    assert merged["errors"] == [], merged["errors"]
    assert all(not (p.get("seed") or {}).get("constant") for p in merged["processes"])  # a seeded generator: nothing


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize("mode", ["chain", "multi", "pmap", "nnx"])
def test_jax_graphs_compile_counts_and_output_are_unchanged_by_the_probe(tmp_path, jax_python, mode) -> None:
    args = [str(FIX / "jax_graphs.py"), "--mode", mode]
    env = {"XLA_FLAGS": "--xla_force_host_platform_device_count=2"}
    bare = _run(jax_python, args, tmp_path / "bare", probe=False, env=env)
    probed = _run(jax_python, args, tmp_path / "probed", env=env)
    assert probed.stdout == bare.stdout  # the program's own compile count is printed last
    merged = merge_reports(tmp_path / "probed" / "probe")
    # steps are host calls of the function holding the optimizer update: 60, not 60 x devices
    assert merged["optimizer_steps"] == 60
    proc = merged["processes"][0]
    assert proc["clock"]["source"] == "jax training step"
    assert not any(f["name"].endswith("(step_fn)") and not f["train"] for f in proc["jax"]["functions"])
    # the Flax Dropout(0.1) layer: applied in the training step, called without a mask in the evaluation
    drops = {f["name"]: f.get("dropout") for f in proc["jax"]["functions"] if f.get("dropout")}
    train = [d for name, d in drops.items() if name.endswith(("(step_fn)", "(nnx_step)"))]
    assert train and all(d["on"] == [0.1] and d["off"] == [] for d in train), drops
    assert mode == "pmap" or any(d["on"] == [] and d["off"] == [0.1] for name, d in drops.items() if "eval" in name), \
        drops  # pmap's loop does not evaluate
    # norms at the outermost transformation, handed out of the step as an extra output
    gn = merged["grad_norms"]
    assert len(gn["values"]) == 60 and gn["clip"]["max_norm"] == 1.0
    assert all(post <= 1.0 + 1e-6 and pre >= post for _, post, _, pre, _, _ in gn["values"])
    # the optimizer's state measured at each update: fresh (zero) at the first only
    states = [row[5] for row in gn["values"]]
    assert states[0] == 0 and all(s > 0 for s in states[1:]), states[:3]
    # one optimizer: the chain (and the multi_transform branches) are parameter groups of it
    assert len(merged["optimizers"]) == 1
    groups = merged["optimizers"][0]["param_groups"]
    assert sorted(g["weight_decay"] for g in groups) == [0.0, 0.1]
    decayed = next(g for g in groups if g["weight_decay"] == 0.1)
    assert decayed["decay_mode"] == "decoupled" and all(len(shape) == 2 for _, shape in decayed["tensors"])


# ---------------------------------------------------------------- host reads, measured the same way everywhere

CODE_READS = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Dropout(0.1), torch.nn.Linear(8, 1))
    opt = torch.optim.Adam(m.parameters(), lr=0.01)   # Adam reads its step count inside step(): not the program's
    extra = "--extra" in sys.argv

    class Data(torch.utils.data.Dataset):  # host-side indexing: reads in the input pipeline, not the step's
        def __init__(self):
            self.x, self.order = torch.randn(640, 4), torch.randperm(640)
        def __len__(self):
            return 640
        def __getitem__(self, i):
            return self.x[self.order[i].item()]

    batches = iter(torch.utils.data.DataLoader(Data(), batch_size=16))
    for step in range(1, 41):
        loss = m(next(batches)).pow(2).mean()
        loss.backward(); opt.step(); opt.zero_grad()
        print(f"step {step} loss {loss.item():.5f}")
        table = list(range(100))
        rows = [table[i] for i in torch.randint(0, 100, (8,))]  # CPU elements as indices: input preparation
        if extra:
            float(loss)  # a second read every step
        if step % 20 == 0:
            m.eval()
            with torch.no_grad():
                print("eval", sum(m(torch.randn(8, 4)).sum().item() for _ in range(5)))
            m.train()
""")


@pytest.mark.slow
def test_torch_host_reads_per_step_with_evaluation_and_the_optimizer_apart(tmp_path) -> None:
    script = tmp_path / "reads.py"
    script.write_text(CODE_READS)
    _run(sys.executable, [str(script)], tmp_path / "a")
    rates = read_rates(_record(None, tmp_path / "a" / "probe"))  # type: ignore[arg-type]
    assert len(rates) == 1
    r = rates[0]
    # the intervals after steps 1-39 (the last, after step 40, is the end); evaluation reads apart
    assert r.per_step == pytest.approx(1.0) and r.steps_judged == 39
    assert r.eval_reads == 5 and r.after_training == 1 + 5
    proc = merge_reports(tmp_path / "a" / "probe")["processes"][0]
    assert proc["host_reads"]["internal"] > 0  # Adam's step.item() inside optimizer.step, set apart
    # one per item the loader indexed and 8 a step for the CPU elements used as list indices, set apart
    assert proc["host_reads"]["data"] == 640 + 40 * 8
    assert [(w["step"], w["batches"], w["items"]) for w in proc["eval_windows"]] == [(20, 5, 40), (40, 5, 40)]
    _run(sys.executable, [str(script), "--extra"], tmp_path / "b")
    assert read_rates(_record(None, tmp_path / "b" / "probe"))[0].per_step == pytest.approx(2.0)  # type: ignore[arg-type]


CODE_WORKERS = textwrap.dedent("""
    import torch, torch.multiprocessing as mp
    def work(rank):
        torch.manual_seed(rank)
        m = torch.nn.Linear(4, 1)
        opt = torch.optim.SGD(m.parameters(), lr=0.01)
        for step in range(1, 31):
            loss = m(torch.randn(8, 4)).pow(2).mean()
            loss.backward(); opt.step(); opt.zero_grad()
            print(rank, step, loss.item(), flush=True)
    if __name__ == "__main__":
        mp.spawn(work, nprocs=2)
""")


@pytest.mark.slow
def test_several_processes_are_judged_per_process(tmp_path) -> None:
    """One process per device (xmp.spawn, torch.multiprocessing): each reads once per step. The rate is per
    process (max over processes), not the sum of all reads over one process's steps."""
    script = tmp_path / "workers.py"
    script.write_text(CODE_WORKERS)
    _run(sys.executable, [str(script)], tmp_path / "w")
    rates = read_rates(_record(None, tmp_path / "w" / "probe"))  # type: ignore[arg-type]
    workers = [r for r in rates if r.steps_judged]
    assert len(workers) == 2 and all(r.per_step == pytest.approx(1.0) for r in workers)


# ---------------------------------------------------------------- [probe] seed

CODE_CONSTANT_SEED = textwrap.dedent("""
    import random, numpy as np, torch
    torch.manual_seed(1234); np.random.seed(1234); random.seed(1234)
    print(torch.rand(1).item(), np.random.rand(), random.random(), np.random.default_rng(7).random())
""")


@pytest.mark.slow
def test_probe_seed_offsets_constant_seeds_and_leaves_seed_zero_alone(tmp_path) -> None:
    script = tmp_path / "const.py"
    script.write_text(CODE_CONSTANT_SEED)
    bare = _run(sys.executable, [str(script)], tmp_path / "bare", probe=False).stdout
    zero = _run(sys.executable, [str(script)], tmp_path / "s0", options={"seed": True}, env={"LADDER_SEED": "0"}).stdout
    one = _run(sys.executable, [str(script)], tmp_path / "s1", options={"seed": True}, env={"LADDER_SEED": "1"}).stdout
    off = _run(sys.executable, [str(script)], tmp_path / "off", env={"LADDER_SEED": "1"}).stdout
    assert zero == bare and off == bare
    assert all(a != b for a, b in zip(one.split(), bare.split()))  # every generator moved
    seed = merge_reports(tmp_path / "s1" / "probe")["seed"]
    assert seed["offset"] > 0 and seed["calls"]["torch.manual_seed"] == 1 and seed["calls"]["random.seed"] == 1


# ---------------------------------------------------------------- logs without a global step

def test_epoch_and_batch_give_the_step_and_repeats_are_counted() -> None:
    spec = ParseSpec(loss=r"Epoch (?P<epoch>\d+)/\d+ \[batch (?P<batch>\d+)/(?P<batches>\d+)\] loss: (?P<loss>\S+)",
                     metric=r"acc=(?P<value>\S+)", direction="max")
    p = OutputParser(spec)
    for epoch in (1, 2):
        for batch in (20, 40, 62):
            p.feed(f"Epoch {epoch}/49 [batch {batch}/62] loss: 0.5", 0.0)
    p.feed("Epoch 2/49 [batch 62/62] loss: 0.4", 0.0)  # printed twice
    assert [pt.step for pt in p.curve] == [20, 40, 62, 82, 102, 124, 124]
    assert p.repeated_steps == 1 and p.first_repeat == 124
    zero = OutputParser(ParseSpec(loss=r"ep (?P<epoch>\d+) it (?P<batch>\d+) loss (?P<loss>\S+)",
                                  metric=r"acc=(?P<value>\S+)", direction="max"))
    for epoch in (0, 1):
        for it in range(3):  # zero-based, batches per epoch not printed: learnt from the first epoch
            zero.feed(f"ep {epoch} it {it} loss 1.0", 0.0)
    assert [pt.step for pt in zero.curve] == [1, 2, 3, 4, 5, 6]


def test_a_loss_pattern_needs_a_step_or_an_epoch_and_a_batch() -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError, match="`epoch` and `batch`"):
        ParseSpec(loss=r"epoch (?P<epoch>\d+) loss (?P<loss>\S+)", metric=r"(?P<value>\S+)", direction="max")


# ---------------------------------------------------------------- optimizers compared tensor by tensor

def _torch_adamw(decay_embeddings: bool = True) -> dict:
    decayed = [["wte.weight", [65, 32]], ["fc.weight", [32, 32]]] if decay_embeddings else [["fc.weight", [32, 32]]]
    nodecay = [["fc.bias", [32]], ["ln.weight", [32]]] + ([] if decay_embeddings else [["wte.weight", [65, 32]]])
    common = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8, "amsgrad": False, "foreach": None,
              "decoupled_weight_decay": True}
    return {"framework": "torch", "name": "AdamW", "class": "torch.optim.adamw.AdamW", "clip": {"max_norm": 1.0},
            "param_groups": [{**common, "weight_decay": 0.1, "tensors": decayed},
                             {**common, "weight_decay": 0.0, "tensors": nodecay}]}


def _optax_multi(decay_embeddings: bool) -> dict:
    common = {"name": "adamw", "betas": [0.9, 0.95], "eps": 1e-8, "nesterov": False}
    emb = ["['params']['wte']['embedding']", [65, 32]]
    decayed = ([emb] if decay_embeddings else []) + [["['params']['fc']['kernel']", [32, 32]]]
    nodecay = [["['params']['fc']['bias']", [32]], ["['params']['ln']['scale']", [32]]] + ([] if decay_embeddings else [emb])
    return {"framework": "optax", "name": "adamw", "class": "optax.chain", "clip": {"max_norm": 1.0},
            "param_groups": [{**common, "weight_decay": 0.1, "decay_mode": "decoupled", "tensors": decayed},
                             {**common, "weight_decay": 0.0, "tensors": nodecay}]}


@pytest.mark.slow
@pytest.mark.jax
@pytest.mark.parametrize("mode", ["chain", "multi", "inject"])
def test_optax_ports_match_their_torch_reference_optimizer(tmp_path, jax_python, mode) -> None:
    """Real runs: torch AdamW with decay and no-decay groups and clip_grad_norm_, against the JAX port with an
    adamw decay mask in a chain, and with multi_transform branches: the same optimisation, tensor by tensor."""
    _run(sys.executable, [str(FIX / "xla_graphs.py")], tmp_path / "ref")
    _run(jax_python, [str(FIX / "jax_graphs.py"), "--mode", mode], tmp_path / "port")
    ref = merge_reports(tmp_path / "ref" / "probe")["optimizers"]
    port = merge_reports(tmp_path / "port" / "probe")["optimizers"]
    assert len(ref) == len(port) == 1
    assert optimizer_diff(port[0], ref[0], ["lr", "initial_lr"]) == []


@pytest.mark.slow
@pytest.mark.jax
def test_a_clip_inside_each_multi_transform_branch_is_a_clip_per_group(tmp_path, jax_python) -> None:
    """round 12's dpclass/jax_multi_transform_clip_per_group: clip_by_global_norm(1.0) inside each branch of a
    multi_transform takes each group's own norm, where torch's clip_grad_norm_ takes one norm over every parameter;
    the configuration reads the same (one max_norm, the same groups), the elements each clip is given do not."""
    from ladder.checks.l2 import clip_coverage, clip_coverage_difference

    _run(sys.executable, [str(FIX / "xla_graphs.py")], tmp_path / "ref")
    ok = _run(jax_python, [str(FIX / "jax_graphs.py"), "--mode", "multi"], tmp_path / "ok")
    bad = _run(jax_python, [str(FIX / "jax_graphs.py"), "--mode", "multi_clip"], tmp_path / "bad")
    assert ok.stdout.splitlines()[5] != bad.stdout.splitlines()[5]  # the fault acts: the clip binds
    ref, good, per_group = (merge_reports(tmp_path / d / "probe") for d in ("ref", "ok", "bad"))
    r, g, b = ref["optimizers"][0], good["optimizers"][0], per_group["optimizers"][0]
    assert optimizer_diff(b, r, ["lr", "initial_lr"]) == []  # what the configuration alone shows: nothing
    assert g["clip_coverage"] == {"calls": 1, "min_elements": 8 * 32 + 32 + 32 + 32 + 32 + 1, "max_elements": 385}
    # the decay branch: the two kernels (8 x 32, 32 x 1); the other: the biases and the LayerNorm's scale
    assert b["clip_coverage"] == {"calls": 2, "min_elements": 32 + 32 + 32 + 1, "max_elements": 8 * 32 + 32}
    assert clip_coverage(ref, r)[0] == 1.0 and clip_coverage(good, g)[0] == 1.0
    assert clip_coverage_difference(good, g, ref, r, 0.01) is None
    why = clip_coverage_difference(per_group, b, ref, r, 0.01)
    assert why and "97 of its optimizer's 385 parameter elements (25%)" in why and "385 of 385 (100%)" in why, why


def test_multi_transform_branches_compare_as_parameter_groups() -> None:
    ignore = ["lr", "initial_lr"]
    assert optimizer_diff(_optax_multi(True), _torch_adamw(), ignore) == []
    diffs = optimizer_diff(_optax_multi(False), _torch_adamw(), ignore)
    assert len(diffs) == 1 and "weight_decay 0.1 -> None" in diffs[0] and "wte.weight" in diffs[0]
    assert "['params']['wte']['embedding']" in diffs[0] and "(32, 65)" in diffs[0]
    no_clip = {**_optax_multi(True), "clip": None}
    assert optimizer_diff(no_clip, _torch_adamw(), ignore) == ["gradient clipping (global norm) 1.0 -> none"]


def test_a_parameter_one_side_lacks_is_named() -> None:
    """A port without the LayerNorm's bias (flax's default bias=True vs a torch model built with bias=False, and
    the other way round): the tensors only one side optimizes are named with their shapes."""
    port = _optax_multi(True)
    port["param_groups"][1]["tensors"] = port["param_groups"][1]["tensors"] + [["['params']['ln']['bias']", [32]]]
    diffs = optimizer_diff(port, _torch_adamw(), ["lr", "initial_lr"])
    assert diffs == ["the parameters differ: the reference optimizes 4 tensors, the run 5: 1 more of shape (32,) in "
                     "the run (run: ['params']['fc']['bias'], ['params']['ln']['scale'], ['params']['ln']['bias']; "
                     "reference: fc.bias, ln.weight)"]
    # the same extra bias, and the embeddings no longer decayed: the tensors that match still compare
    port = _optax_multi(False)
    port["param_groups"][1]["tensors"] = port["param_groups"][1]["tensors"] + [["['params']['ln']['bias']", [32]]]
    diffs = optimizer_diff(port, _torch_adamw(), ["lr", "initial_lr"])
    assert len(diffs) == 2 and diffs[0].startswith("the parameters differ: the reference optimizes 4 tensors, the run 5")
    assert "weight_decay 0.1 -> None" in diffs[1] and "wte.weight" in diffs[1] and "(32, 65)" in diffs[1]


def _attention(split: bool, bias_mask: bool = False) -> dict:
    """One attention layer: torch's fused c_attn (192, 64) + bias (192,) and c_proj, or flax's
    MultiHeadDotProductAttention (query/key/value kernels (64, 4, 16), biases (4, 16), out kernel (4, 16, 64)),
    AdamW with decay on the kernels; `bias_mask`: the port's mask decays every 2-D parameter, biases (4, 16) too."""
    common = {"lr": 1e-3, "betas": [0.9, 0.95], "eps": 1e-8}
    if not split:
        decayed, nodecay = [["c_attn.weight", [192, 64]], ["c_proj.weight", [64, 64]]], \
            [["c_attn.bias", [192]], ["c_proj.bias", [64]]]
        return {"framework": "torch", "name": "AdamW", "class": "torch.optim.adamw.AdamW", "param_groups": [
            {**common, "decoupled_weight_decay": True, "weight_decay": 0.1, "tensors": decayed},
            {**common, "decoupled_weight_decay": True, "weight_decay": 0.0, "tensors": nodecay}]}
    kernels = [[f"['attn']['{n}']['kernel']", [64, 4, 16]] for n in ("query", "key", "value")]
    biases = [[f"['attn']['{n}']['bias']", [4, 16]] for n in ("query", "key", "value")]
    decayed = kernels + [["['attn']['out']['kernel']", [4, 16, 64]]] + (biases if bias_mask else [])
    nodecay = [["['attn']['out']['bias']", [64]]] + ([] if bias_mask else biases)
    common = {"name": "adamw", **common}
    return {"framework": "optax", "name": "adamw", "class": "optax.chain", "param_groups": [
        {**common, "weight_decay": 0.1, "decay_mode": "decoupled", "tensors": decayed},
        {**common, "weight_decay": 0.0, "tensors": nodecay}]}


def test_a_fused_layer_split_in_the_port_is_the_same_optimisation_and_its_decay_still_compares() -> None:
    notes: list[str] = []
    assert optimizer_diff(_attention(True), _attention(False), ["lr", "initial_lr"], notes) == []
    assert len(notes) == 1 and "laid out differently" in notes[0] and "the same 16576 elements" in notes[0], notes
    # a decay mask by ndim decays the split biases (4, 16), which the reference's (192,) bias never was
    diffs = optimizer_diff(_attention(True, bias_mask=True), _attention(False), ["lr", "initial_lr"])
    assert len(diffs) == 1 and diffs[0].startswith("the parameters differ"), diffs
    assert "weight_decay 0.1" in diffs[0] and "16384 elements in the reference, 16576 in the run" in diffs[0], diffs
    # a layer the port lacks is no re-layout: the elements differ
    lost = _attention(True)
    lost["param_groups"][0]["tensors"] = lost["param_groups"][0]["tensors"][1:]
    diffs = optimizer_diff(lost, _attention(False), ["lr", "initial_lr"])
    assert len(diffs) == 1 and "laid out differently" not in diffs[0] and "the parameters differ" in diffs[0], diffs


CLIP_CODE = textwrap.dedent("""
    import sys, torch
    torch.manual_seed(0)
    m = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.Tanh(), torch.nn.Linear(16, 1))
    opt = torch.optim.SGD(m.parameters(), lr=0.01)
    x, y = torch.randn(256, 8), 5 * torch.randn(256, 1)   # norms of ~10: a clip at 0.5 binds at every step
    for step in range(1, 41):
        loss = (m(x) - y).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        if sys.argv[1] == "clip":
            torch.nn.utils.clip_grad_norm_(m.parameters(), 0.5)
        elif sys.argv[1] == "by_hand":   # what a port writes when its framework has no clip_grad_norm_
            total = torch.sqrt(sum(p.grad.pow(2).sum() for p in m.parameters()))
            for p in m.parameters():
                p.grad.mul_(torch.clamp(0.5 / (total + 1e-6), max=1.0))
        elif sys.argv[1] == "per_device":  # 4 shards' gradients, each clipped before their mean (the LoRA+ fault)
            shards = []
            for xs, ys in zip(x.chunk(4), y.chunk(4)):
                g = torch.autograd.grad((m(xs) - ys).pow(2).mean(), list(m.parameters()))
                n = torch.sqrt(sum(t.pow(2).sum() for t in g))
                shards.append([t * torch.clamp(0.5 / (n + 1e-6), max=1.0) for t in g])
            for p, *gs in zip(m.parameters(), *shards):
                p.grad = sum(gs) / 4
        opt.step()
        print(f"step {step} loss {loss.item():.5f}")
""")


@pytest.mark.slow
def test_a_clip_written_by_hand_is_not_a_missing_clip(tmp_path) -> None:
    """The probe sees torch's clip_grad_norm_ (or optax's transformation), not a hand-written clip. A port without
    a visible clip is judged on the gradient norms its optimizer received: none above the reference's max_norm
    while the reference's clip bound is the clip, written by hand; one above it is the clip missing."""
    from ladder.checks import CheckContext, run_ladder
    from ladder.migration.protocol import load_protocol
    from test_l2_checks import _baseline

    def record(mode: str) -> RunRecord:
        p = _run(sys.executable, ["-c", CLIP_CODE, mode], tmp_path / mode)
        return _record(p, tmp_path / mode / "probe")

    def check(run: RunRecord, ref: RunRecord):
        ctx = CheckContext(run=run, protocol=load_protocol(), baseline=_baseline(ref), expected_platform="cpu")
        return next(c for c in run_ladder(ctx, up_to="L2").checks if c.name == "optimizer_unchanged")

    ref = record("clip")
    assert ref.probe["optimizers"][0]["clip"]["max_norm"] == 0.5
    by_hand, missing = record("by_hand"), record("none")
    assert by_hand.probe["optimizers"][0].get("clip") is None  # invisible as a transformation
    ok = check(by_hand, ref)
    assert ok.status == "passed" and "clipped by hand" in ok.evidence, ok.evidence
    bad = check(missing, ref)
    assert bad.status == "failed" and "gradient clipping (global norm) 0.5 -> none" in bad.evidence
    assert "received gradient norms up to" in bad.evidence, bad.evidence
    # each shard clipped at 0.5 before the mean: no norm above 0.5, but none at 0.5 either, where a global clip
    # binding at every step leaves exactly 0.5
    per_device = check(record("per_device"), ref)
    assert per_device.status == "failed" and "gradient clipping (global norm) 0.5 -> none" in per_device.evidence
    assert "made smaller some other way (clipped per device before the mean" in per_device.evidence, per_device.evidence
