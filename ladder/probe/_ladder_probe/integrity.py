"""Integrity facts: files the program opened outside the run's allowed roots, the files it opened while an
evaluation window was open (core.clock.eval), and Python files it opened for writing (code rebuilt at
run time: a frozen second stage must not).

A `sys.addaudithook` hook sees every "open" event (builtins.open, io.open_code for imports, os.open),
before the open itself: a path the sandbox hides is still seen. The roots come from LADDER_PROBE_OPTS
("roots"); without them the hook is not installed (audit hooks cannot be removed). ladder judges the facts
(ladder.grade.integrity): other runs' directories, the baselines and the hidden target are violations.

Cheap by construction: a path already seen costs one set lookup (plus the evaluation flag); a new path
is made absolute and matched against the roots once. Must not raise: an exception in an audit hook would
surface in the program's own open call.
"""

from __future__ import annotations

import os
import sys
import time

import _ladder_probe as core

SNAPSHOT_ORDER = 5
MAX_PATHS = 500
# Not data: the interpreter opening modules, extension libraries and bytecode while evaluating.
CODE_SUFFIXES = (".py", ".pyc", ".so", ".pyd", ".pth", ".dylib")
_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_APPEND | os.O_TRUNC

_seen: set = set()
_eval_seen: set = set()
_s: dict = {}
_roots: tuple = ()  # "dir/" prefixes
_roots_exact: frozenset = frozenset()  # the directories themselves
_hooked = False


def reset() -> None:
    _seen.clear()
    _eval_seen.clear()
    _s.clear()
    _s.update(outside=[], eval_reads=[], code_writes=[], overflow=0)


reset()


def _writes(mode, flags) -> bool:
    if isinstance(mode, str):
        return any(c in mode for c in "wax+")
    return isinstance(flags, int) and bool(flags & _WRITE_FLAGS)


def _new_path(path: str, mode, flags) -> None:
    full = os.path.abspath(path)
    if full.endswith(".py") and _writes(mode, flags) and len(_s["code_writes"]) < MAX_PATHS:
        _s["code_writes"].append(full)
    if full == "/" or full.startswith(_roots) or full in _roots_exact:
        return
    if len(_s["outside"]) >= MAX_PATHS:
        _s["overflow"] += 1
        return
    _s["outside"].append({"path": full, "write": _writes(mode, flags), "t": time.time(),
                          "step": core.clock.step, "eval": core.clock.eval})


def _eval_read(path: str) -> None:
    if path in _eval_seen or path.endswith(CODE_SUFFIXES):
        return
    _eval_seen.add(path)
    if len(_s["eval_reads"]) < MAX_PATHS:
        _s["eval_reads"].append(os.path.abspath(path))


def _hook(event: str, args: tuple) -> None:
    if event != "open":
        return
    try:
        path = args[0]
        if path.__class__ is not str:
            if isinstance(path, int):
                return  # an fd: its path was seen when it was opened
            path = os.fsdecode(path)
        if core.clock.eval:
            _eval_read(path)
        if path in _seen:
            return
        _seen.add(path)
        if not core.is_quiet():
            _new_path(path, args[1] if len(args) > 1 else None, args[2] if len(args) > 2 else None)
    except Exception as e:  # never into the program's open()
        core.record_error("integrity open hook", e)


def on_install() -> None:
    global _roots, _roots_exact, _hooked
    roots = [str(r).rstrip("/") for r in core.opts.get("roots") or [] if r]
    if not roots or _hooked:
        return
    _roots = tuple(r + "/" for r in roots if r)
    _roots_exact = frozenset(roots)
    sys.addaudithook(_hook)
    _hooked = True


HOOKS: dict = {}


def snapshot() -> dict:
    if not _hooked:
        return {}
    return {"integrity": {"roots": len(_roots), "outside": list(_s["outside"]), "overflow": _s["overflow"],
                          "eval_reads": list(_s["eval_reads"]), "code_writes": list(_s["code_writes"])}}
