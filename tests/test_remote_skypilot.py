"""The skypilot runner offline: the Tasks it builds are validated by SkyPilot's own Task/Resources classes, and a
whole run goes through SkyPilot's SDK (launch, exec, tail_logs, down) against an API server stood in for at the
HTTP boundary (tests/skypilot_api.py), which plays the cluster on this machine. SkyPilot's price catalog, which
it downloads, is given as the file SkyPilot caches it in (a GCP excerpt: g2-standard-4 with one L4 in us-central1
at its published on-demand price)."""

from __future__ import annotations

import atexit
import os
import shutil
import sys
import tempfile
from pathlib import Path

import pytest

from sshd import free_port, workspace

# Set before SkyPilot is imported: it reads them once per process (its runtime directory, where it caches its
# catalog; the port of "the local API server", which the stand-in takes; no usage pings from tests).
if "SKY_RUNTIME_DIR" not in os.environ:
    os.environ["SKY_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="ladder-sky-")
    atexit.register(shutil.rmtree, os.environ["SKY_RUNTIME_DIR"], True)
os.environ.setdefault("SKYPILOT_API_SERVER_LOCAL_PORT", str(free_port()))
os.environ["SKYPILOT_DISABLE_USAGE_COLLECTION"] = "1"
sky = pytest.importorskip("sky", reason="SkyPilot is not installed (pip install 'ladder[skypilot]')")

from ladder._util.errors import SpecError  # noqa: E402
from ladder.migration.spec import load_spec  # noqa: E402
from ladder.runs.execute import execute_run  # noqa: E402
from skypilot_api import FakeSkyPilot  # noqa: E402

G2_PRICE = 0.70683  # GCP g2-standard-4 (1 x L4), us-central1, on demand, $/h
CATALOG = f"""InstanceType,AcceleratorName,AcceleratorCount,vCPUs,MemoryGiB,GpuInfo,Price,SpotPrice,Region,AvailabilityZone
g2-standard-4,,,4,16,,{G2_PRICE},0.28,us-central1,us-central1-a
,L4,1,,,L4,0.0,0.0,us-central1,us-central1-a
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory) -> FakeSkyPilot:
    from sky.catalog import common

    path = Path(common.get_catalog_path("gcp/vms.csv"))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(CATALOG)
    server = FakeSkyPilot(tmp_path_factory.mktemp("clusters"), int(os.environ["SKYPILOT_API_SERVER_LOCAL_PORT"]))
    yield server
    server.stop()


@pytest.fixture()
def api(server, tmp_path, monkeypatch) -> FakeSkyPilot:
    monkeypatch.setenv("LADDER_CACHE", str(tmp_path / "ladder-cache"))
    server.calls.clear()
    return server


def sky_workspace(tmp_path: Path, accelerators: str = "L4:1", extra: str = "", **kw) -> Path:
    ws = workspace(tmp_path, None, **kw)
    text = (ws / "ladder.toml").read_text()
    start = text.index('runner = "ssh"')
    end = text.index("price_per_hour = 2.0")
    table = (f'runner = "skypilot"\nskypilot = {{ cluster = "ladder-test", accelerators = "{accelerators}", '
             f'infra = "gcp", autostop_minutes = 10{extra} }}\n'
             'setup = ["{python} -m venv --without-pip {env}"]\npython = "{env}/bin/python"\n')
    (ws / "ladder.toml").write_text(text[:start] + table + text[end + len("price_per_hour = 2.0"):])
    return ws


@pytest.mark.parametrize("accelerators,cloud", [("L4:1", "GCP"), ("A100:1", "GCP"), ("tpu-v5e-8", "GCP")])
def test_the_task_for_a_gpu_or_tpu_profile_is_a_valid_skypilot_task(tmp_path, api, accelerators, cloud) -> None:
    from ladder.runs.remote.skypilot import build_tasks

    ws = sky_workspace(tmp_path, accelerators)
    spec = load_spec(ws / "ladder.toml")
    launch, run = build_tasks(spec, "target", "short", 0, ws / "repo", "~/.ladder/runs/x", 60.0, None)
    for task in (launch, run):
        (res,) = task.resources
        assert res.accelerators == sky.Resources(accelerators=accelerators).accelerators
        assert str(res.cloud) == cloud
        # SkyPilot's own round trip: the YAML it would send validates back into a Task
        again = sky.Task.from_yaml_config(task.to_yaml_config())
        assert list(again.resources)[0].accelerators == res.accelerators
    assert "venv --without-pip" in launch.setup and "prepare" in launch.setup  # the profile's setup, cached by hash
    assert any(dst.startswith("~/.ladder/lib/") for dst in launch.file_mounts)
    assert run.run.endswith(" job") and run.workdir == str(ws / "repo") and "LADDER_JOB" in run.envs
    assert run.setup is None and launch.run is None


def test_a_run_through_skypilot_s_sdk_launch_exec_tail_down(tmp_path, api) -> None:
    ws = sky_workspace(tmp_path, extra=", down = true", steps=40, sleep=0.01)
    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short", seed=1)
    assert record.infrastructure is None, record.infrastructure
    assert record.exit_code == 0 and record.loss_lines == 40 and record.metric == pytest.approx(0.901)
    assert record.runner == "skypilot" and record.remote.host == "ladder-test" and record.remote.job_id == 1
    # the price is SkyPilot's catalog price of what it launched
    assert record.price_per_hour == pytest.approx(G2_PRICE)
    assert record.remote.price_source.startswith("skypilot catalog: 1 x GCP(g2-standard-4")
    run_dir = ws / "runs" / "remote-test" / record.run_id
    assert (run_dir / "stdout.log").read_text().splitlines()[0].endswith("\tstep 1 loss 1.001000")
    assert list((run_dir / "probe").glob("probe-*.json")) and (run_dir / "exit.json").exists()
    assert [c for c in api.calls if c.startswith("POST")] == [
        "POST /validate", "POST /launch", "POST /validate", "POST /exec", "POST /logs", "POST /down"]
    assert "ladder-test" not in api.clusters  # down = true tore it down
    assert record.sandbox in ("bwrap", "none") and record.provenance.python.endswith("/bin/python")


def test_a_preempted_cluster_is_the_infrastructure_s_failure(tmp_path, api) -> None:
    ws = sky_workspace(tmp_path, steps=400, sleep=0.02)
    preempted: list[bool] = []

    def progress(ev: str, data: dict) -> None:
        if ev == "loss" and data["step"] >= 20 and not preempted:
            api.preempt("ladder-test")
            preempted.append(True)

    record = execute_run(load_spec(ws / "ladder.toml"), "target", "short", progress=progress)
    assert preempted and record.infrastructure is not None and record.infrastructure.kind == "preempted"
    assert record.exit_code is None and "ended without an exit record" in record.infrastructure.detail


def test_without_skypilot_the_spec_says_how_to_install_it(tmp_path, monkeypatch) -> None:
    ws = sky_workspace(tmp_path)
    monkeypatch.setitem(sys.modules, "sky", None)  # as if it were not installed
    with pytest.raises(SpecError) as e:
        load_spec(ws / "ladder.toml")
    assert "pip install 'ladder[skypilot]'" in str(e.value)
