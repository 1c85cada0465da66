"""A stand-in for SkyPilot's API server, at the HTTP boundary: SkyPilot's own SDK talks to it unchanged.

It answers the endpoints the skypilot runner uses (health, validate, launch, exec, logs, job_status, cancel,
down, api/get, api/stream) with payloads built by SkyPilot's own server-side classes (Request, its encoders,
CloudVmRayResourceHandle), and plays the cluster on this machine: a directory stands for the cluster's home,
`launch` copies the file mounts there and runs the setup, `exec` copies the workdir to ~/sky_workdir and runs
the task's `run` as a job whose output `logs` streams. Nothing of ladder is patched. It listens on the port
SkyPilot's client takes for a local API server (SKYPILOT_API_SERVER_LOCAL_PORT), so the SDK sends paths, not
uploads, as it does with a local server.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any
from urllib.parse import parse_qs, urlparse


class Cluster:
    def __init__(self, name: str, home: Path, resources: Any) -> None:
        self.name, self.home, self.resources = name, home, resources
        self.jobs: dict[int, dict[str, Any]] = {}
        self.up = True


class FakeSkyPilot:
    def __init__(self, root: Path, port: int = 0) -> None:
        self.root = root
        self.clusters: dict[str, Cluster] = {}
        self.requests: dict[str, Any] = {}
        self.calls: list[str] = []
        self.lock = threading.Lock()
        self.server = ThreadingHTTPServer(("127.0.0.1", port), self._handler())
        self.port = self.server.server_address[1]
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    def stop(self) -> None:
        for c in self.clusters.values():
            for job in c.jobs.values():
                _kill(job["proc"])
        self.server.shutdown()

    # ------------------------------------------------------------------ SkyPilot's own payloads

    def _request(self, name: str, body: Any, value: Any = None, error: BaseException | None = None,
                 cluster: str | None = None) -> str:
        from sky.server import constants as server_constants
        from sky.server.requests import requests as requests_lib

        rid = uuid.uuid4().hex
        req = requests_lib.Request(request_id=rid, name=server_constants.REQUEST_NAME_PREFIX + name, entrypoint=json.dumps, request_body=body,
                                   status=requests_lib.RequestStatus.FAILED if error else
                                   requests_lib.RequestStatus.SUCCEEDED, created_at=time.time(),
                                   user_id="ladder-tests", cluster_name=cluster, finished_at=time.time())
        if error is not None:
            req.set_error(error)
        else:
            req.set_return_value(value)
        self.requests[rid] = req
        return rid

    def _handle(self, cluster: Cluster) -> Any:
        from sky.backends.cloud_vm_ray_backend import CloudVmRayResourceHandle

        return CloudVmRayResourceHandle(cluster_name=cluster.name, cluster_name_on_cloud=cluster.name,
                                        cluster_yaml=None, launched_nodes=1, launched_resources=cluster.resources)

    def _task(self, dag_yaml: str) -> Any:
        from sky.utils import dag_utils

        return dag_utils.load_chain_dag_from_yaml_str(dag_yaml).tasks[0]

    def _shell(self, cluster: Cluster, script: str, cwd: Path, env: dict[str, str], log: Path) -> subprocess.Popen:
        full = {"PATH": os.environ["PATH"], "HOME": str(cluster.home), "LANG": "C.UTF-8", **env}
        return subprocess.Popen(["bash", "-c", script], cwd=cwd, env=full, stdout=open(log, "ab"),
                                stderr=subprocess.STDOUT, start_new_session=True)

    # ------------------------------------------------------------------ endpoints

    def launch(self, body: dict[str, Any]) -> str:
        from sky import exceptions
        from sky.server.requests import payloads

        task = self._task(body["task"])
        name = body["cluster_name"]
        resources = list(task.resources)[0]
        if resources.accelerators and "unavailable" in str(resources.accelerators).lower():
            return self._request("launch", payloads.LaunchBody(**body),
                                 error=exceptions.ResourcesUnavailableError("no capacity"), cluster=name)
        cluster = self.clusters.get(name)
        if cluster is None or not cluster.up:
            home = self.root / name
            home.mkdir(parents=True, exist_ok=True)
            from sky import Resources

            # what a cloud would launch for the ask: the L4 machine type of the catalog SkyPilot read
            launched = Resources(infra="gcp/us-central1", instance_type="g2-standard-4",
                                 accelerators=resources.accelerators, use_spot=resources.use_spot)
            cluster = self.clusters[name] = Cluster(name, home, launched)
        for dst, src in (task.file_mounts or {}).items():
            target = cluster.home / dst[2:] if dst.startswith("~/") else Path(dst)
            shutil.rmtree(target, ignore_errors=True)
            shutil.copytree(src, target)
        log = self.root / f"{name}-setup.log"
        if task.setup:
            rc = self._shell(cluster, task.setup, cluster.home, dict(task.envs), log).wait()
            if rc != 0:
                return self._request("launch", payloads.LaunchBody(**body), cluster=name, error=exceptions.CommandError(
                    rc, task.setup, f"setup failed: {log.read_text()[-500:]}", None))
        return self._request("launch", payloads.LaunchBody(**body), (None, self._handle(cluster)), cluster=name)

    def exec(self, body: dict[str, Any]) -> str:
        from sky.server.requests import payloads

        task = self._task(body["task"])
        cluster = self.clusters[body["cluster_name"]]
        work = cluster.home / "sky_workdir"
        shutil.rmtree(work, ignore_errors=True)
        shutil.copytree(task.workdir, work, symlinks=True)
        job_id = len(cluster.jobs) + 1
        log = cluster.home / f"job-{job_id}.log"
        log.write_bytes(b"")
        proc = self._shell(cluster, task.run, work, dict(task.envs), log)
        cluster.jobs[job_id] = {"proc": proc, "log": log}
        return self._request("exec", payloads.ExecBody(**body), (job_id, self._handle(cluster)),
                             cluster=cluster.name)

    def job_state(self, cluster: Cluster, job_id: int) -> str:
        rc = cluster.jobs[job_id]["proc"].poll()
        if not cluster.up:
            return "FAILED_DRIVER"
        return "RUNNING" if rc is None else "SUCCEEDED" if rc == 0 else "FAILED"

    def preempt(self, name: str) -> None:
        """The cloud takes the cluster back (a spot preemption): its jobs die with it."""
        cluster = self.clusters[name]
        cluster.up = False
        for job in cluster.jobs.values():
            _kill(job["proc"])


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def _handler_class(api: FakeSkyPilot) -> type:
    from sky import __commit__, __version__
    from sky.server import constants as server_constants

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"  # streamed bodies are chunked, as SkyPilot's server sends them

        def log_message(self, *args: Any) -> None:
            pass

        def _send(self, code: int, data: Any, request_id: str | None = None) -> None:
            raw = json.dumps(data).encode()
            self.send_response(code)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(raw)))
            self.send_header("Connection", "close")
            self.send_header(server_constants.API_VERSION_HEADER, str(server_constants.API_VERSION))
            self.send_header(server_constants.VERSION_HEADER, __version__)
            if request_id:
                self.send_header("X-Skypilot-Request-ID", request_id)
            self.end_headers()
            self.wfile.write(raw)

        def _stream_start(self, request_id: str) -> None:
            self.send_response(200)
            self.send_header("Content-Type", "text/plain")
            self.send_header(server_constants.API_VERSION_HEADER, str(server_constants.API_VERSION))
            self.send_header(server_constants.VERSION_HEADER, __version__)
            self.send_header("X-Skypilot-Request-ID", request_id)
            self.send_header(server_constants.STREAM_REQUEST_HEADER, request_id)
            self.send_header("Transfer-Encoding", "chunked")
            self.send_header("Connection", "close")
            self.end_headers()

        def _chunk(self, data: bytes) -> None:
            self.wfile.write(b"%x\r\n%s\r\n" % (len(data), data))
            self.wfile.flush()

        def _stream_end(self) -> None:
            self.wfile.write(b"0\r\n\r\n")
            self.wfile.flush()

        def do_GET(self) -> None:
            url = urlparse(self.path)
            q = {k: v[0] for k, v in parse_qs(url.query).items()}
            api.calls.append(f"GET {url.path}")
            if url.path == "/api/health":
                self._send(200, {"status": "healthy", "api_version": server_constants.API_VERSION,
                                 "version": __version__, "version_on_disk": __version__, "commit": __commit__,
                                 "user": {"name": "ladder-tests", "id": "ladder-tests"},
                                 "basic_auth_enabled": False})
            elif url.path == "/api/get":
                req = api.requests[q["request_id"]]
                self._send(200, req.encode().model_dump())
            elif url.path == "/api/stream":
                self._stream_start(q["request_id"])
                self._chunk(b"(the cluster is up)\n")
                self._stream_end()
            else:
                self._send(404, {"detail": f"not served by the test's API server: {url.path}"})

        def do_POST(self) -> None:
            from sky.server.requests import payloads

            url = urlparse(self.path)
            api.calls.append(f"POST {url.path}")
            body = json.loads(self.rfile.read(int(self.headers.get("Content-Length", 0))) or b"{}")
            with api.lock:
                if url.path == "/validate":
                    return self._send(200, {})
                if url.path == "/launch":
                    return self._send(200, {}, api.launch(body))
                if url.path == "/exec":
                    return self._send(200, {}, api.exec(body))
                if url.path == "/job_status":
                    cluster = api.clusters[body["cluster_name"]]
                    status = {j: api.job_state(cluster, j) for j in body.get("job_ids") or cluster.jobs}
                    from sky.skylet import job_lib

                    value = {j: job_lib.JobStatus(s) for j, s in status.items()}
                    return self._send(200, {}, api._request("job_status", payloads.JobStatusBody(**body), value))
                if url.path == "/cancel":
                    cluster = api.clusters[body["cluster_name"]]
                    for j in body.get("job_ids") or []:
                        proc = cluster.jobs[j]["proc"]
                        try:
                            os.killpg(proc.pid, signal.SIGTERM)
                        except ProcessLookupError:
                            pass
                    return self._send(200, {}, api._request("cancel", payloads.CancelBody(**body), None))
                if url.path == "/down":
                    api.clusters.pop(body["cluster_name"], None)
                    return self._send(200, {}, api._request("down", payloads.StopOrDownBody(**body), None))
            if url.path == "/logs":
                return self._logs(body)
            self._send(404, {"detail": f"not served by the test's API server: {url.path}"})

        def _logs(self, body: dict[str, Any]) -> None:
            from sky import exceptions
            from sky.server.requests import payloads

            cluster = api.clusters.get(body["cluster_name"])
            if cluster is None or not cluster.up:
                rid = api._request("logs", payloads.ClusterJobBody(**body), cluster=body["cluster_name"],
                                   error=exceptions.ClusterNotUpError("the cluster is not up", None))
                self._stream_start(rid)
                self._stream_end()
                return
            job = cluster.jobs[body["job_id"]]
            with open(job["log"], "rb") as f:
                streamed_rid = uuid.uuid4().hex
                self._stream_start(streamed_rid)
                while True:
                    line = f.readline()
                    if line.endswith(b"\n"):
                        self._chunk(line)
                        continue
                    f.seek(f.tell() - len(line))
                    if job["proc"].poll() is not None or not cluster.up:
                        rest = f.read()
                        if rest:
                            self._chunk(rest)
                        break
                    time.sleep(0.05)
            state = api.job_state(cluster, body["job_id"])
            error = None if cluster.up else exceptions.ClusterNotUpError("the cluster was preempted", None)
            rid = api._request("logs", payloads.ClusterJobBody(**body), 0 if state == "SUCCEEDED" else 100,
                               error=error, cluster=cluster.name)
            api.requests[streamed_rid] = api.requests.pop(rid)  # answered before the stream ends
            self._stream_end()

    return Handler


FakeSkyPilot._handler = lambda self: _handler_class(self)  # type: ignore[attr-defined]
