"""Small helpers shared by tests: copy a fixture workspace, run the real CLI."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path
from typing import Callable

FIXTURES = Path(__file__).resolve().parent / "fixtures"


def workspace(tmp_path: Path, name: str = "tiny") -> Path:
    dst = tmp_path / name
    shutil.copytree(FIXTURES / name, dst)
    return dst


def ladder_cli(*args: str, cwd: Path, env: dict | None = None, timeout: float = 600) -> subprocess.CompletedProcess:
    full_env = {**os.environ, "LADDER_PLAIN": "1", **(env or {})}
    return subprocess.run([sys.executable, "-m", "ladder", *args], cwd=cwd, env=full_env, capture_output=True,
                          text=True, timeout=timeout)


def cli_json(*args: str, cwd: Path, env: dict | None = None, ok_codes=(0,)) -> dict:
    p = ladder_cli(*args, "--json", cwd=cwd, env=env)
    assert p.returncode in ok_codes, f"exit {p.returncode}\nstdout:{p.stdout}\nstderr:{p.stderr}"
    return json.loads(p.stdout)


def set_var(ws: Path, key: str, value: str) -> None:
    """Edit a top-level-table var of the workspace's ladder.toml (tests use `extra` for flags)."""
    text = (ws / "ladder.toml").read_text()
    (ws / "ladder.toml").write_text(text.replace(f'{key} = ""', f'{key} = "{value}"'))


class FakeAnthropic:
    """A local stand-in for the Anthropic Messages API: the SDK's base URL (or ANTHROPIC_BASE_URL) points at
    `url`; each request's path, body and key are kept in `seen`; `answer(prompt)` gives the reply's text;
    `fail = True` answers with an API error."""

    def __init__(self, answer: Callable[[str], str]) -> None:
        self.answer, self.seen, self.fail = answer, [], False
        api = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:  # noqa: N802
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                api.seen.append({"path": self.path, "body": body, "key": self.headers.get("x-api-key")
                                 or (self.headers.get("authorization") or "").removeprefix("Bearer ")})
                if api.fail:
                    self._send(500, {"type": "error", "error": {"type": "api_error", "message": "boom"}})
                    return
                text = api.answer(body["messages"][0]["content"])
                self._send(200, {"id": "msg_1", "type": "message", "role": "assistant", "model": body["model"],
                                 "content": [{"type": "text", "text": text}], "stop_reason": "end_turn",
                                 "stop_sequence": None, "usage": {"input_tokens": 10, "output_tokens": 5}})

            def _send(self, status: int, obj: dict) -> None:
                data = json.dumps(obj).encode()
                self.send_response(status)
                self.send_header("content-type", "application/json")
                self.send_header("content-length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)

            def log_message(self, *a) -> None:
                pass

        self.server = HTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> "FakeAnthropic":
        threading.Thread(target=self.server.serve_forever, daemon=True).start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
