"""Content hashes and sha256 manifests for immutable directories (baselines, run directories)."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

MANIFEST_NAME = "MANIFEST.sha256"


def sha256_bytes(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: Path, chunk: int = 1 << 20) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(chunk):
            h.update(block)
    return h.hexdigest()


def canonical_json(obj: Any) -> bytes:
    """The byte form that is hashed: sorted keys, no whitespace, UTF-8."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False, default=str).encode()


# Top-level entries never hashed: a run's scratch copy of the code under test, which the program
# itself may write to (checkpoints, caches), is not evidence.
UNHASHED = ("work",)


def tree_hashes(root: Path) -> dict[str, str]:
    """sha256 of every file under root (relative POSIX paths), the manifest itself excluded."""
    out: dict[str, str] = {}
    for p in sorted(root.rglob("*")):
        rel = p.relative_to(root)
        if rel.parts[0] in UNHASHED or not p.is_file() or p.name == MANIFEST_NAME:
            continue
        out[rel.as_posix()] = sha256_file(p)
    return out


def write_manifest(root: Path) -> str:
    """Write MANIFEST.sha256 for root; return the manifest's own sha256 (the directory's identity)."""
    hashes = tree_hashes(root)
    text = "".join(f"{h}  {name}\n" for name, h in hashes.items())
    (root / MANIFEST_NAME).write_text(text)
    return sha256_bytes(text.encode())


def read_manifest(root: Path) -> dict[str, str]:
    out: dict[str, str] = {}
    for line in (root / MANIFEST_NAME).read_text().splitlines():
        if line.strip():
            h, name = line.split("  ", 1)
            out[name] = h
    return out


def manifest_digest(root: Path) -> str:
    return sha256_file(root / MANIFEST_NAME)


def verify_manifest(root: Path) -> list[str]:
    """Problems found (empty list = intact): edited, missing and added files, each named."""
    if not (root / MANIFEST_NAME).exists():
        return [f"{root}: no {MANIFEST_NAME}"]
    return diff_hashes(read_manifest(root), tree_hashes(root))


def diff_hashes(before: dict[str, str], after: dict[str, str],
                words: tuple[str, str, str] = ("missing", "edited", "added")) -> list[str]:
    """What changed between two {name: hash} maps, each name once: gone, changed, new."""
    gone, changed, new = words
    out = [f"{gone}: {n}" if n not in after else f"{changed}: {n}" for n, h in before.items() if after.get(n) != h]
    return out + [f"{new}: {n}" for n in after if n not in before]
