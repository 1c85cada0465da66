"""What ladder ships to a remote machine: its agent, the modules the agent reuses there, and the probe.

The bundle is a gzipped tar of files at their package paths, named by the sha256 of its contents: a
machine unpacks one bundle once (`<root>/lib/<digest>/`), and a new ladder version ships a new one beside
it. Every module listed must import the standard library only.
"""

from __future__ import annotations

import functools
import hashlib
import io
import tarfile
from pathlib import Path

LADDER = Path(__file__).resolve().parents[2]
# The agent and what it imports on the remote side; each of these imports the standard library only.
MODULES = ("__init__.py", "_progress.py", "_util/__init__.py", "_util/errors.py", "runs/__init__.py", "runs/envs.py",
           "runs/runner/__init__.py", "runs/runner/local.py", "runs/runner/sandbox.py", "runs/runner/tree.py",
           "runs/runner/scrub.py", "runs/remote/__init__.py", "runs/remote/agent.py")
AGENT = "ladder/runs/remote/agent.py"
PROBE = "ladder/probe"


def _files() -> list[tuple[str, Path]]:
    files = [(f"ladder/{m}", LADDER / m) for m in MODULES]
    probe = LADDER / "probe"
    files += [(f"{PROBE}/{p.relative_to(probe)}", p) for p in sorted(probe.rglob("*.py"))]
    return files


@functools.lru_cache(maxsize=1)
def bundle() -> tuple[str, bytes]:
    """(digest, tar.gz bytes): deterministic for the same files, so the digest names the contents."""
    h = hashlib.sha256()
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz", compresslevel=6) as tar:
        for arc, path in _files():
            data = path.read_bytes()
            h.update(arc.encode() + b"\0" + data)
            info = tarfile.TarInfo(arc)
            info.size, info.mode, info.mtime = len(data), 0o644, 0
            tar.addfile(info, io.BytesIO(data))
    return h.hexdigest()[:16], buf.getvalue()
