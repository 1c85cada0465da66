"""Tensor-level parity (L1 `parity`) and weights loaded back (L3 `weights_load_back`), on real runs.

The graded fixture's sides are both torch on the CPU (fast); the example's faithful PyTorch/XLA and JAX
ports, and the demo's planted fault, run in their real environments (marked xla / jax).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from helpers import workspace

from ladder.checks import CheckContext
from ladder.checks.load_back import weights_load_back
from ladder.checks.parity import parity
from ladder.migration.protocol import load_protocol
from ladder.migration.spec import load_spec
from ladder.parity.compare import compare_sides
from ladder.parity.runs import ParityRuns, exported_weights, run_load_back, run_parity
from ladder.runs.execute import execute_run
from ladder.runs.records import RunRecord

REPO = Path(__file__).resolve().parent.parent
EXAMPLE = REPO / "examples" / "classifier"
NCSU = load_protocol("ncsu")


def graded(tmp_path: Path) -> Path:
    ws = workspace(tmp_path, "graded")
    subprocess.run([sys.executable, "make_data.py"], cwd=ws, check=True)
    return ws


def port_copy(ws: Path, name: str, edits: dict[str, tuple[str, str]] | None = None) -> Path:
    """A copy of the fixture as a port, with exact text edits (each must apply once)."""
    dst = ws.parent / name
    shutil.copytree(ws, dst, ignore=shutil.ignore_patterns("runs", "__pycache__"))
    for file, (old, new) in (edits or {}).items():
        text = (dst / file).read_text()
        assert text.count(old) == 1, (file, old)
        (dst / file).write_text(text.replace(old, new))
    return dst


def short_baseline(spec, ws: Path, tmp_path: Path):  # noqa: ANN001, ANN201
    """A baseline of the reference's short run at seed 0, for the checks that compare with it."""
    from ladder.baselines.store import Baseline, BaselineMeta

    ref = execute_run(spec, "reference", "short", 0, source=ws, run_dir=tmp_path / "ref-short")
    return Baseline(root=tmp_path, meta=BaselineMeta(
        name="t", version=1, created_at=ref.started_at, profile="reference", platform="cpu", seeds=[0], full_seeds=[],
        spec_sha256="", protocol="ncsu"), short_runs=[ref], full_runs=[])


def check_parity(runs: ParityRuns, run: RunRecord):  # noqa: ANN201
    return parity(CheckContext(run=run, protocol=NCSU, options={"parity": runs.as_option()}))


@pytest.mark.slow
def test_parity_passes_a_faithful_port_and_names_the_first_tensor_that_differs(tmp_path: Path) -> None:
    ws = graded(tmp_path)
    spec = load_spec(ws / "ladder.toml")
    ref = ws / "runs" / "parity-reference"
    faithful = run_parity(spec, port_copy(ws, "faithful"), ws / "runs" / "p-faithful", reference_dir=ref)
    target_run = RunRecord.load(faithful.target)
    assert target_run.kind == "parity" and target_run.exit_code == 0 and (faithful.target / "MANIFEST.sha256").is_file()
    inputs = np.load(faithful.target / "inputs.npz")
    assert all(k.startswith(("weights/", "batch/")) for k in inputs.files)  # the target never sees the answers
    ok = check_parity(faithful, target_run)
    assert ok.status == "passed", ok.evidence
    rows = ok.details["rows"]
    names = [r["tensor"] for r in rows]
    assert names[:2] == ["outputs/outputs", "loss"] and names[2] == "grads/fc.weight" and names[-1] == "params/head.bias"
    assert all(r["max_abs_diff"] <= 1e-6 for r in rows)  # the same code, the same numbers

    eps = run_parity(spec, port_copy(ws, "eps", {"model.py": ("EPS = 1e-5", "EPS = 1e-2")}),
                     ws / "runs" / "p-eps", reference_dir=ref)
    bad = check_parity(eps, RunRecord.load(eps.target))
    assert bad.status == "failed" and bad.measured["tensor"] == "outputs/outputs", bad.evidence
    assert bad.measured["max_abs_diff"] > 1e-4 and "first tensor that differs: outputs/outputs" in bad.evidence

    loss = run_parity(spec, port_copy(ws, "loss", {"train.py": ("torch.nn.CrossEntropyLoss()",
                                                                "torch.nn.CrossEntropyLoss(label_smoothing=0.1)")}),
                      ws / "runs" / "p-loss", reference_dir=ref)
    assert check_parity(loss, RunRecord.load(loss.target)).measured["tensor"] == "loss"

    momentum = run_parity(spec, port_copy(ws, "momentum", {"train.py": ("momentum=0.9", "momentum=0.8")}),
                          ws / "runs" / "p-momentum", reference_dir=ref)
    m = check_parity(momentum, RunRecord.load(momentum.target))
    assert m.measured["tensor"].startswith("params/"), m.evidence  # outputs, loss and gradients agree

    skipped = run_parity(spec, port_copy(ws, "skip", {"adapter.py": ('SKIP = ""', 'SKIP = "norm.bias"')}),
                         ws / "runs" / "p-skip", reference_dir=ref)
    s = check_parity(skipped, RunRecord.load(skipped.target))
    assert s.status == "failed" and "never read by the target's adapter" in s.evidence and "norm.bias" in s.evidence
    # the reference side ran once and was reused by every port
    assert len(list(ref.glob("run.json"))) == 1 and json.loads((ref / "parity.json").read_text())["side"] == "reference"


def test_compare_lists_every_interface_problem_at_once(tmp_path: Path) -> None:
    def side(name: str, meta: dict, arrays: dict) -> Path:
        d = tmp_path / name
        d.mkdir()
        np.savez(d / "parity.npz", **arrays)
        order = {g: [k.split("/", 1)[1] for k in arrays if k.startswith(g + "/")]
                 for g in ("weights", "batch", "outputs", "grads", "params")}
        (d / "parity.json").write_text(json.dumps({"error": None, "order": order, **meta}))
        return d

    w = {"weights/a.weight": np.ones((3, 2)), "weights/a.bias": np.ones(3)}
    ref = side("ref", {}, {**w, "outputs/o": np.ones(4), "loss": np.array(1.0), "grads/a.weight": np.ones((3, 2)),
                           "grads/a.bias": np.ones(3), "params/a.weight": np.ones((3, 2)), "params/a.bias": np.ones(3)})
    tgt = side("tgt", {"reads": {"a.weight": 1, "a.bias": 0},
                       "transplant": [{"target": "k", "source": "a.weight", "transpose": True},
                                      {"target": "k2", "source": "a.weight", "transpose": False},
                                      {"target": "b", "source": "a.bias", "transpose": True}]},
               {"outputs/o": np.ones(4), "loss": np.array(1.0), "grads/a.weight": np.ones((2, 3)),
                "params/a.weight": np.ones((3, 2)), "params/a.bias": np.ones(3), "params/extra": np.ones(1)})
    report = compare_sides(ref, tgt, NCSU.parity.tolerances["fp32-cpu"], "fp32-cpu")
    text = " | ".join(report.problems)
    assert not report.passed
    for expected in ("grads: no a.bias", "grads: shapes differ (a transpose missing?): a.weight [2, 3]",
                     "params: names the reference does not have: extra", "never read by the target's adapter",
                     "a.bias is declared transposed but has 1 dimension", "used more than once: a.weight -> k, k2"):
        assert expected in text, (expected, text)


@pytest.mark.slow
def test_weights_that_miss_a_layer_do_not_load_back(tmp_path: Path) -> None:
    ws = graded(tmp_path)
    spec = load_spec(ws / "ladder.toml")
    results = {}
    for name, extra in (("whole", ""), ("no-head", "--drop-layer head")):
        text = (ws / "ladder.toml").read_text().replace('vars = { extra = "" }', f'vars = {{ extra = "{extra}" }}')
        (ws / "ladder.toml").write_text(text)
        spec = load_spec(ws / "ladder.toml")
        run_dir = ws / "runs" / f"full-{name}"
        run = execute_run(spec, "target", "full", source=ws, run_dir=run_dir)
        weights = exported_weights(spec, run_dir)
        assert weights == run_dir / "weights.npz" and "weights.npz" in (run_dir / "MANIFEST.sha256").read_text()
        back = run_load_back(spec, weights, ws / "runs" / f"load-back-{name}")
        assert back.kind == "evaluate"
        results[name] = weights_load_back(CheckContext(run=run, protocol=NCSU, full_run=run,
                                                       options={"load_back": {"dir": str(ws / "runs" /
                                                                                         f"load-back-{name}")}}))
    assert results["whole"].status == "passed", results["whole"].evidence
    assert results["whole"].measured == 0.0  # the reference's evaluation of the same weights: the same accuracy
    miss = results["no-head"]
    assert miss.status == "failed" and "missing: head.bias, head.weight" in miss.evidence, miss.evidence


HAND_SGD = """

class HandSGD:
    \"\"\"torch's SGD with momentum, written by hand: no torch.optim object for the probe to read.\"\"\"

    def __init__(self, params, lr, momentum):
        self.params, self.lr, self.momentum = list(params), lr, momentum
        self.buf = [None] * len(self.params)

    def zero_grad(self):
        for p in self.params:
            p.grad = None

    @torch.no_grad()
    def step(self):
        for i, p in enumerate(self.params):
            if p.grad is not None:
                b = self.buf[i]
                self.buf[i] = p.grad.clone() if b is None else b.mul_(self.momentum).add_(p.grad)
                p.add_(self.buf[i], alpha=-self.lr)
"""


@pytest.mark.slow
def test_a_hand_written_update_is_verified_by_parity_or_said_not_checked(tmp_path: Path) -> None:
    from ladder.checks.l2 import optimizer_unchanged

    ws = graded(tmp_path)
    spec = load_spec(ws / "ladder.toml")
    baseline = short_baseline(spec, ws, tmp_path)
    verdicts = {}
    for name, momentum in (("hand", "0.9"), ("hand-bad", "0.8")):
        port = port_copy(ws, name, {"train.py": ("    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)",
                                                 f"    return HandSGD(model.parameters(), lr, {momentum})")})
        text = (port / "train.py").read_text()
        (port / "train.py").write_text(text.replace("\n\ndef make_optimizer", HAND_SGD + "\n\ndef make_optimizer", 1))
        run = execute_run(spec, "target", "short", 0, source=port, run_dir=tmp_path / f"{name}-short")
        assert run.exit_code == 0 and not run.probe["optimizers"], run.last_lines
        sides = run_parity(spec, port, tmp_path / f"p-{name}", reference_dir=tmp_path / "parity-reference")
        ctx = lambda options: CheckContext(run=run, protocol=NCSU, baseline=baseline,  # noqa: E731
                                           expected_platform="cpu", options=options)
        verdicts[name] = (optimizer_unchanged(ctx({})), optimizer_unchanged(ctx({"parity": sides.as_option()})))
    alone, with_parity = verdicts["hand"]
    assert alone.status == "not_checked" and "a [parity] table would verify it" in alone.evidence, alone.evidence
    assert with_parity.status == "passed" and "verified at tensor level" in with_parity.evidence, with_parity.evidence
    # momentum 0.8 written by hand: parity fails on the parameters, so nothing verifies the update
    assert [v.status for v in verdicts["hand-bad"]] == ["not_checked", "not_checked"], verdicts["hand-bad"]


def test_parity_is_not_applicable_without_a_parity_table() -> None:
    run = RunRecord(run_id="r", kind="short", profile="target", platform="cpu", seed=0, command="x", cwd=".",
                    started_at=0.0, timeout_s=1.0, provenance={"source": "."})  # type: ignore[arg-type]
    assert parity(CheckContext(run=run, protocol=NCSU)).status == "not_applicable"
    asked = parity(CheckContext(run=run, protocol=NCSU, options={"parity": None}))
    assert asked.status == "not_checked" and "ladder parity --source" in asked.evidence


# ---------------------------------------------------------------- the example's ports, in their environments

@pytest.fixture(scope="module")
def example_reference(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The example's reference side (torch CPU), shared by the XLA and JAX tests."""
    ws = tmp_path_factory.mktemp("example")
    shutil.copytree(EXAMPLE, ws / "ex", ignore=shutil.ignore_patterns("__pycache__", "runs"))
    return ws / "ex"


def _example_parity(ws: Path, target: str, source: Path, out: str) -> tuple[ParityRuns, RunRecord]:
    spec = load_spec(ws / ("ladder.toml" if target == "xla" else "ladder-jax.toml"))
    runs = run_parity(spec, source, ws / "runs" / out, reference_dir=ws / "runs" / "parity-reference")
    return runs, RunRecord.load(runs.target)


def _demo_fault(ws: Path, target: str, name: str) -> Path:
    """The port with the demo's planted label-smoothing fault (attempt 2 of migrations/<target>.toml)."""
    import tomllib

    patch = tomllib.loads((ws / "migrations" / f"{target}.toml").read_text())["attempt"][1]["patch"]
    dst = ws / name
    shutil.copytree(ws / "ports" / target, dst, ignore=shutil.ignore_patterns("__pycache__"))
    subprocess.run(["git", "init", "-q"], cwd=dst, check=True)
    subprocess.run(["git", "apply", "-"], input=patch, text=True, cwd=dst, check=True)
    return dst


@pytest.mark.slow
@pytest.mark.parametrize("target", [pytest.param("xla", marks=pytest.mark.xla), pytest.param("jax", marks=pytest.mark.jax)])
def test_example_port_passes_parity_and_its_planted_fault_names_the_loss(example_reference: Path, target: str,
                                                                         request: pytest.FixtureRequest) -> None:
    request.getfixturevalue(f"{target}_python")  # the target environment (built once, shared)
    ws = example_reference
    runs, run = _example_parity(ws, target, ws / "ports" / target, f"{target}-faithful")
    ok = check_parity(runs, run)
    assert ok.status == "passed", ok.evidence
    assert ok.threshold["tolerance"] == "fp32-cpu" and len(ok.details["rows"]) == 2 + 2 * 10
    assert run.wall_s is not None
    runs, run = _example_parity(ws, target, _demo_fault(ws, target, f"{target}-fault"), f"{target}-fault")
    bad = check_parity(runs, run)
    assert bad.status == "failed" and bad.measured["tensor"] == "loss", bad.evidence


L2_LOSS = """

_MODELS = []  # make_optimizer registers the model; the loss reads its parameters when it is called


class L2Loss(torch.nn.Module):
    \"\"\"Cross-entropy plus FACTOR x sum of squared parameters: torch's coupled decay written into the loss.\"\"\"

    def forward(self, out, y):
        l2 = sum((p * p).sum() for p in _MODELS[-1].parameters())
        return torch.nn.functional.cross_entropy(out, y) + FACTOR * l2
"""


@pytest.mark.slow
def test_a_weight_decay_moved_into_the_loss_is_verified_by_parity_and_a_removed_or_doubled_one_is_not(
        tmp_path: Path) -> None:
    from ladder.checks.l2 import optimizer_unchanged

    wd = 0.05
    ws = graded(tmp_path)
    sgd = "torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9)"
    decayed = f"torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, weight_decay={wd})"
    (ws / "train.py").write_text((ws / "train.py").read_text().replace(sgd, decayed))  # the reference decays
    spec = load_spec(ws / "ladder.toml")
    baseline = short_baseline(spec, ws, tmp_path)
    verdicts = {}
    # moved: (wd/2)|w|^2 in the loss, no decay in SGD (the same gradient, the same update); doubled: wd|w|^2;
    # removed: no decay anywhere
    for name, factor in (("moved", wd / 2), ("doubled", wd), ("removed", None)):
        port = port_copy(ws, name, {"train.py": (decayed, sgd)})
        if factor is not None:
            text = (port / "train.py").read_text().replace("return torch.nn.CrossEntropyLoss()", "return L2Loss()")
            text = text.replace(f"    return {sgd}", f"    _MODELS.append(model)\n    return {sgd}")
            text = text.replace("\n\ndef make_loss", L2_LOSS.replace("FACTOR", repr(factor)) + "\n\ndef make_loss", 1)
            (port / "train.py").write_text(text)
        run = execute_run(spec, "target", "short", 0, source=port, run_dir=tmp_path / f"{name}-short")
        assert run.exit_code == 0 and run.probe["optimizers"][0]["param_groups"][0]["weight_decay"] == 0, run.last_lines
        sides = run_parity(spec, port, tmp_path / f"p-{name}", reference_dir=tmp_path / "parity-reference")
        ctx = lambda options: CheckContext(run=run, protocol=NCSU, baseline=baseline,  # noqa: E731
                                           expected_platform="cpu", options=options)
        with_parity = ctx({"parity": sides.as_option()})
        verdicts[name] = (optimizer_unchanged(ctx({})), optimizer_unchanged(with_parity), parity(with_parity))
    for name, (alone, l2, p) in verdicts.items():
        assert alone.status == "failed" and "weight_decay 0.05 -> None" in alone.evidence, (name, alone.evidence)
    alone, l2, p = verdicts["moved"]
    assert l2.status == "passed" and "moved between the loss and the optimizer" in l2.evidence, l2.evidence
    assert "c = 0.05" in l2.evidence, l2.evidence  # each gradient is the reference's plus 0.05 x the weights
    assert p.status == "passed" and "moved weight decay" in p.evidence, p.evidence
    # the loss and the gradients do differ, by the L2 term: the loss by exactly (wd/2)|w|^2
    assert p.details["first_failure"]["tensor"] == "loss" and p.details["decay_loss_agrees"] is True, p.details
    assert sum(r["tensor"].startswith("grads/") and not r["passed"] for r in p.details["rows"]) >= 4, p.details
    for name in ("doubled", "removed"):
        _, l2, p = verdicts[name]
        assert l2.status == "failed" and "weight_decay 0.05 -> None" in l2.evidence, (name, l2.evidence)
    assert verdicts["doubled"][2].status == "failed", verdicts["doubled"][2].evidence  # the update differs
