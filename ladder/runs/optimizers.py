"""The optimizers a run used, as timelines: an optimizer built again during the run is the same optimizer.

A preemptible job saves a checkpoint, builds its model and optimizer anew, loads the checkpoint into them
and goes on; the probe then sees a second optimizer object from that step on. Read as two optimizers, a
faithful resume "changes the optimisation" (two optimizers against the reference's one), and the first
object's rate log, which stops at the resume, would be compared with the reference's schedule up to the end.

So a record with the configuration of an earlier one (class, parameter groups and their tensors, clip; the
rate and the protocol's ignored keys aside; tensors by shape, since a model built anew may not be named yet
when its optimizer first steps) that starts after that one's last step is the same optimizer,
built again: its rate log continues the earlier one's from its first step. What a rebuild can change is
kept apart, as a fact of the rebuild: whether the new object started with the state the old one had built
up (momentum, Adam's moments and step count), or with none, the checkpoint restored without it. Only
torch's optimizers say (optax's state is a value of the program's, not the transformation's).

This module reads probe records only; the checks judge them (ladder/checks/l2.py).
"""

from __future__ import annotations

import bisect
import copy
import json
from typing import Any


def _config(o: dict[str, Any], ignore: set[str]) -> str:
    # tensors by shape, in order: a model built anew may not be named yet when its optimizer first steps
    groups = [{**{k: v for k, v in g.items() if k not in ignore and k != "tensors"},
               "shapes": [t[1] for t in g.get("tensors") or [] if isinstance(t, (list, tuple)) and len(t) > 1]}
              for g in o.get("param_groups") or []]
    return json.dumps({"class": o.get("class"), "groups": groups, "clip": o.get("clip")}, sort_keys=True,
                      default=str)


def _rate_at(values: list, step: int) -> Any:
    xs = [v[0] for v in values]
    i = bisect.bisect_right(xs, step) - 1
    return values[max(i, 0)][1]


def _continue_rates(into: dict[str, Any], rec: dict[str, Any], start: int) -> None:
    """The merged rate log: the earlier object's rates before `start`, the rebuilt one's from there on."""
    a, b = into.get("lr"), rec.get("lr")
    if not isinstance(a, dict) or not isinstance(b, dict):
        return
    if b.get("stopped") and not a.get("stopped"):
        a["stopped"] = b["stopped"]
    va, vb = sorted(a.get("values") or []), sorted(b.get("values") or [])
    if not vb:
        return
    kept = [v for v in va if v[0] < start]
    at = _rate_at(vb, start)
    if not kept or kept[-1][1] != at:
        kept.append([start, at])
    for v in vb:
        if v[0] > start and kept[-1][1] != v[1]:
            kept.append(list(v))
    a["values"] = kept


def timelines(optimizers: list[dict[str, Any]], ignore: list[str] | tuple[str, ...] = ("lr", "initial_lr")
              ) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """(one record per optimizer timeline, in the order first seen; the rebuilds). A rebuild is {"step": the
    rebuilt object's first step, "class", "state_restarted": True when the earlier object held state and the
    new one had none before its first step (None when the probe could not tell), "state_entries": how many
    parameters had state at that step}. The records are copies: the probe report is left as it was."""
    skip = {"lr", "initial_lr", *ignore}
    out: list[dict[str, Any]] = []
    rebuilds: list[dict[str, Any]] = []
    keys: list[str] = []
    order = sorted(range(len(optimizers)), key=lambda i: (int(optimizers[i].get("first_step") or 0), i))
    for i in order:
        rec = optimizers[i]
        key = _config(rec, skip)
        start = int(rec.get("first_step") or 0)
        earlier = next((m for m, k in zip(out, keys) if k == key and start > int(
            m.get("last_step") if m.get("last_step") is not None else m.get("first_step") or 0)), None)
        if earlier is None:
            out.append(copy.deepcopy(rec))
            keys.append(key)
            continue
        restarted = None
        if "state_at_first_step" in rec and "stateful" in earlier:
            restarted = bool(earlier.get("stateful")) and int(rec["state_at_first_step"]) == 0
        rebuilds.append({"step": start, "class": rec.get("class"), "state_restarted": restarted,
                         "state_entries": rec.get("state_at_first_step")})
        _continue_rates(earlier, rec, start)
        earlier["changes"] = [*(earlier.get("changes") or []), *(rec.get("changes") or [])]
        earlier["rebuilt_at"] = [*(earlier.get("rebuilt_at") or []), start]
        if rec.get("last_step") is not None:
            earlier["last_step"] = rec["last_step"]
        if "stateful" in rec:
            earlier["stateful"] = bool(earlier.get("stateful")) or bool(rec["stateful"])
    return out, rebuilds
