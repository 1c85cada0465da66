"""L1 `randomness`: the port draws new random numbers where the reference does.

A JAX key gives the same numbers every time it is used. A port that hands its training step the same key
each call repeats its dropout masks every step; one that shuffles each epoch with the same key repeats its
data order. Both stay within seed noise for a long time, so neither the curves nor the metric show them.
The probe (ladder/probe/_ladder_probe/jax_facts.py) records, for each random draw traced in the training
step, how many distinct keys the first calls used, and for each draw made on the host while training,
whether a key was used again at a later step.

A checkpoint resumed within the run builds its model again as the template the checkpoint is restored into,
from the same key: draws inside a Flax, Haiku or Equinox initialisation are not counted by the probe, and a
draw of the run's start made again where the optimizer was built anew, no more often than it was, is that
initialisation repeated.

A port may also draw numbers no seed controls at all: numpy's or Python's global generator drawn from and never
seeded, or a generator the program sets from OS entropy (`np.random.default_rng()`); its data order is new in
every run, so two runs at the same seed differ while each looks like another seed. The probe reports both
(ladder/probe/_ladder_probe/seed.py); the run fails for such draws the reference does not make. The opposite, a
data order no seed changes, fails the same way: a DataLoader shuffling with a `torch.Generator()` never seeded
(torch's fixed default seed) gives every run at every seed the same order.

A data-parallel port may also hand every worker the same data: one shard on every device of a pmap or a
batch-sharded jit (the host batch's device slices all equal), or every process iterating the same data instead of
its own shard (the inputs one process trains on fingerprinted by another too). Each step then sees a fraction of the
data it should, and the curves, averaged over the copies, stay within noise.

A port may also consume another number of items in all: the global batch size read as each device's (a pmap given
the whole batch on every device), half a batch, or other epochs. Its curves, averaged over a larger batch, stay within
noise. The probe records the shapes of each training input on both sides (batches.py); the items are counted in the
size of one item of the reference's first training input and summed over steps and processes.

A port may also change the dropout the reference trains with, while its curves stay within noise for a long time:
a Flax layer left deterministic in the training step (`train: bool = False` by default, the flag never passed), a
rate that is not the reference's (a keep probability read as a drop rate), or dropout the reference has at rate 0
switched on. The probe reads the rates of the dropout layers each training step applied and of those it called
without applying them: torch's `nn.Dropout` modules by their mode at optimizer steps, Flax's `Dropout` (linen and
nnx) by whether the call returned its input unchanged inside the jitted training step.

Relative to the reference: a repeat the reference's own run makes as well is not the port's. A torch
reference has no keys (its generators advance by themselves), so it repeats nothing. A run that drew no
JAX random numbers while training has nothing to judge: not_applicable.
"""

from __future__ import annotations

import math
from typing import Any

from ladder.checks import CheckContext, not_checked, register
from ladder.checks.results import CheckResult
from ladder.runs.optimizers import timelines

NAME = "randomness"


def _facts(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    return (probe or {}).get("random")


def repeats(facts: dict[str, Any] | None, min_calls: int, rebuilds: list[int] | None = None,
            reinitialised: list[str] | None = None) -> list[str]:
    """What this run's random draws repeat, one line each (none when every draw had a new key). A draw made
    before training and made again with the same key where the optimizer was built anew (`rebuilds`: a
    checkpoint resumed, its model initialised once more as the template the checkpoint is restored into) is
    that initialisation repeated, not a repeated draw, when it repeats no more often than the run rebuilt."""
    out = []
    for d in (facts or {}).get("step_draws") or []:
        if d["calls"] >= min_calls and d["distinct"] < d["calls"]:
            same = "the same key in all" if d["distinct"] == 1 else f"only {d['distinct']} distinct keys in"
            out.append(f"the {d['draw']} draw traced in {d['function']} used {same} {d['calls']} sampled calls: "
                       "the same random numbers (a dropout mask, a noise sample) step after step")
    for h in (facts or {}).get("host_draws") or []:
        if h["reused"]:
            first, again = h["first_reuse"] or ["?", "?"]
            if rebuilds and first == 0 and h["reused"] <= len(rebuilds) and isinstance(again, int) and any(
                    r - 1 <= again <= r + 1 for r in rebuilds):
                if reinitialised is not None:
                    reinitialised.append(f"{h['site']} (step {again})")
                continue
            out.append(f"jax.random.{h['draw']} at {h['site']} drew with the same key after {first} and after "
                       f"{again} training steps ({h['reused']} of {h['calls']} calls reuse a key): the same draw, "
                       "e.g. the same data order every epoch")
    return out


MIN_BATCHES = 20  # fingerprinted training inputs a process needs before its repeats are judged


def fingerprint_streams(probe: dict[str, Any] | None) -> list[dict[str, Any]]:
    """The processes' fingerprinted training inputs as the streams they were trained in. Processes that ran one after
    another (each started after every earlier one had ended: a run preempted and resumed, a launcher that starts
    training again from the checkpoint the last process wrote) are one stream, in time order, their steps numbered
    on; processes that overlap in time (data-parallel workers) are each their own. A process with no end recorded
    (killed) overlaps."""
    entries = [b for b in (probe or {}).get("batches") or [] if b.get("fps")]
    spans = [b.get("span") or [None, None] for b in entries]
    if len(entries) < 2 or any(a is None or z is None for a, z in spans):
        return entries
    order = sorted(range(len(entries)), key=lambda i: spans[i][0])
    if any(spans[order[k + 1]][0] < spans[order[k]][1] for k in range(len(order) - 1)):
        return entries
    fps: list[list[Any]] = []
    offset = 0
    sources: dict[str, int] = {}
    for i in order:
        b = entries[i]
        fps += [[step + offset, fp] for step, fp in b["fps"]]
        offset += max(step for step, _ in b["fps"])
        for k, n in (b.get("sources") or {}).items():
            sources[k] = sources.get(k, 0) + n
    return [{"fps": fps, "pid": ", ".join(str(entries[i].get("pid")) for i in order), "in_a_row": len(order),
             "sources": sources, "unmeasured": sum(int(entries[i].get("unmeasured") or 0) for i in order)}]


def batch_repeats(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    """How often the run trains on an input it has already trained on (ladder/probe/_ladder_probe/batches.py: a
    hash of each training forward's or step's data): the process that repeats the largest share, with its first
    repeat; None when no process fingerprinted enough inputs (data made on the device is not read back)."""
    worst = None
    for b in fingerprint_streams(probe):
        fps = b.get("fps") or []
        if len(fps) < MIN_BATCHES:
            continue
        seen: dict[str, int] = {}
        repeats, first = 0, None
        for step, fp in fps:
            if fp in seen:
                repeats += 1
                if first is None:
                    first = [seen[fp], step]
            else:
                seen[fp] = step
        # the last input of a step given again as the first of the next (a forward repeated within a step is not)
        again = [b[0] for a, b in zip(fps, fps[1:]) if a[1] == b[1] and b[0] == a[0] + 1]
        stat = {"inputs": len(fps), "repeats": repeats, "share": repeats / len(fps), "first": first,
                "next_step": len(again), "first_next_step": again[0] if again else None,
                "pid": b.get("pid"), "sources": b.get("sources") or {}, "unmeasured": b.get("unmeasured", 0),
                "in_a_row": b.get("in_a_row", 1)}
        if worst is None or (stat["share"], stat["next_step"]) > (worst["share"], worst["next_step"]):
            worst = stat
    return worst


def _next_step_bound(run: dict[str, Any], ref: dict[str, Any]) -> float:
    """How many inputs given again at the very next step the run may have: the reference's rate over as many
    inputs, three Poisson standard errors of it, and 2 (chance: a sampler with replacement over few batches)."""
    expected = ref.get("next_step", 0) / ref["inputs"] * run["inputs"]
    return expected + 3 * math.sqrt(expected) + 2


def repeated_batches(run_probe: dict[str, Any] | None, ref_probe: dict[str, Any] | None,
                     excess: float) -> tuple[str | None, dict[str, Any]]:
    """Whether the run trains on repeated inputs more often than the reference: its share of repeats above the
    reference's by more than `excess` plus three binomial standard errors of the reference's share (a reference
    that samples with replacement from small data repeats by chance, and so may its port). Returns (why, measured);
    why is None when it does not, or when either side is unmeasured."""
    mine, theirs = batch_repeats(run_probe), batch_repeats(ref_probe)
    measured: dict[str, Any] = {"batches": mine, "reference_batches": theirs}
    if mine is None or theirs is None:
        return None, measured
    p = theirs["share"]
    bound = p + excess + 3 * math.sqrt(p * (1 - p) / mine["inputs"])
    measured["batch_repeat_bound"] = round(bound, 4)
    if mine["share"] <= bound:
        limit = _next_step_bound(mine, theirs)
        if mine.get("next_step", 0) > limit:
            return (f"the run trains on the same input at two consecutive steps {mine['next_step']} times in "
                    f"{mine['inputs']} training inputs (first at step {mine['first_next_step']}), the reference "
                    f"{theirs.get('next_step', 0)} times in {theirs['inputs']} (at most {limit:.1f} allowed): a batch "
                    "handed out again at the next step (a prefetcher that returns the batch it holds before loading "
                    "the next, a buffer overwritten), so another batch is skipped"), measured
        return None, measured
    first = mine["first"] or ["?", "?"]
    return (f"the run trains on an input it has already trained on {mine['repeats']} times in {mine['inputs']} "
            f"training inputs ({mine['share']:.0%}; the first at step {first[1]}, the input of step {first[0]} "
            f"again), the reference {theirs['repeats']} in {theirs['inputs']} ({p:.0%}; at most {bound:.0%} "
            "allowed): the same batch given twice (data-loader workers seeded alike, a dataset every worker yields "
            "whole, a prefetched batch used again), so the run sees less of the data" + _in_a_row(mine)), measured


def _in_a_row(stat: dict[str, Any]) -> str:
    n = stat.get("in_a_row", 1)
    return "" if n < 2 else (f"; the run trained as {n} processes in a row (processes {stat.get('pid')}, each resuming "
                             "where the last stopped): a resumed process that trains again on inputs an earlier one "
                             "trained on restarted the data order (the data position or its random state not restored)")


def shared_data(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    """How much of a data-parallel run's training data every worker shares: within one process, the steps whose
    host data splits into its local devices' slices all equal (a pmap or a batch-sharded jit given one shard on
    every device); across processes, the training inputs one process fingerprinted that another also trained on
    (every process iterating the same data instead of its own shard). The worst of both, or None when neither was
    measured (one device and one process, or too few inputs)."""
    worst = None
    batches = [b for b in fingerprint_streams(probe) if len(b.get("fps") or []) >= MIN_BATCHES]
    for b in (probe or {}).get("batches") or []:
        c = b.get("chunks") or {}
        if c.get("inputs", 0) >= MIN_BATCHES:
            stat = {"inputs": c["inputs"], "shared": c["replicated"], "share": c["replicated"] / c["inputs"],
                    "first": c.get("first"), "across": f"the {c['devices']} devices of process {b.get('pid')}"}
            if worst is None or stat["share"] > worst["share"]:
                worst = stat
    seen = [{fp for _, fp in b["fps"]} for b in batches]
    for i, b in enumerate(batches):
        mine = b["fps"]
        for j, other in enumerate(batches):
            if i == j:
                continue
            hits = [step for step, fp in mine if fp in seen[j]]
            stat = {"inputs": len(mine), "shared": len(hits), "share": len(hits) / len(mine),
                    "first": hits[0] if hits else None,
                    "across": f"processes {b.get('pid')} and {other.get('pid')}"}
            if worst is None or stat["share"] > worst["share"]:
                worst = stat
    return worst


def shared_shards(run_probe: dict[str, Any] | None, ref_probe: dict[str, Any] | None,
                  excess: float) -> tuple[str | None, dict[str, Any]]:
    """Whether the run's devices or processes train on the same data more often than the reference's: its share of
    shared inputs above the reference's (0 for a reference with one device and one process, which shares nothing)
    by more than `excess` plus three binomial standard errors. Returns (why, measured)."""
    mine, theirs = shared_data(run_probe), shared_data(ref_probe)
    measured: dict[str, Any] = {"shared_data": mine, "reference_shared_data": theirs}
    if mine is None:
        return None, measured
    p = theirs["share"] if theirs is not None else 0.0
    bound = p + excess + 3 * math.sqrt(p * (1 - p) / mine["inputs"])
    measured["shared_data_bound"] = round(bound, 4)
    if mine["share"] <= bound:
        return None, measured
    ref_words = (f"the reference's {theirs['shared']} of {theirs['inputs']} ({p:.0%})" if theirs is not None else
                 "the reference, on one device and one process, none")
    return (f"{mine['across']} train on the same data: {mine['shared']} of {mine['inputs']} training inputs "
            f"({mine['share']:.0%}, the first at step {mine['first']}) are the same on each, {ref_words} (at most "
            f"{bound:.0%} allowed): one shard given to every device or process (a shard index that is the same on "
            "all of them, no sampler splitting the data), so each step sees a fraction of the data it should"), \
        measured


MIN_SHAPED_SHARE = 0.9  # of a process's training steps whose inputs' items could be counted, for it to be judged


def _item_shape(probe: dict[str, Any] | None) -> tuple[int, ...] | None:
    """The shape of one item of the reference's training data: its most common step's first input without its
    leading (batch) axis, e.g. (32,) for a feature vector or (64,) for a token window. None for a first input of one
    axis (token ids, targets: any array would match) or none at all."""
    best = None
    for b in (probe or {}).get("batches") or []:
        for notes, n in (b.get("shapes") or {}).get("per_step") or []:
            if notes and notes[0] and (best is None or n > best[1]):
                best = (notes[0][0], n)
    if best is None or len(best[0]) < 2 or math.prod(best[0][1:]) < 2:
        return None
    return tuple(best[0][1:])


def _step_items(notes: list, item: tuple[int, ...]) -> int | None:
    """The items one training step consumed: for each input it was given (a forward call, a jitted step), the
    largest count of rows of one item's size among its values, behind one or two leading axes (a batch (B, *item),
    a pmap's (devices, B/devices, *item), micro-batches (k, B/k, *item); an image's axes in another order; the
    inputs and targets of a language model count once), summed over the step's inputs (micro-batches of an
    accumulated step). None when an input has no value of that size."""
    total, size = 0, math.prod(item)
    for shapes in notes:
        rows = [math.prod(s[:j]) for s in shapes for j in (1, 2) if len(s) > j and math.prod(s[j:]) == size]
        if not rows:
            return None
        total += max(rows)
    return total


def consumed_items(probe: dict[str, Any] | None, item: tuple[int, ...] | None) -> dict[str, Any] | None:
    """The items all training steps of a run consumed together, summed over its processes, with its most common
    items per step and its step count; None when a process's steps could not be counted (no inputs of the item
    shape: data indexed inside the step, a flattened batch)."""
    if item is None:
        return None
    total, steps, modes = 0, 0, []
    for b in (probe or {}).get("batches") or []:
        shapes = b.get("shapes") or {}
        if not shapes.get("steps"):
            continue
        counted, items, per = 0, 0, {}
        for notes, n in shapes.get("per_step") or []:
            k = _step_items(notes, item) if notes is not None else None
            if k is not None:
                counted += n
                items += k * n
                per[k] = per.get(k, 0) + n
        if counted < MIN_SHAPED_SHARE * shapes["steps"]:
            return None
        total += round(items * shapes["steps"] / counted)
        steps = max(steps, shapes["steps"])
        modes.append(max(per, key=per.get))
    if not modes:
        return None
    return {"items": total, "steps": steps, "per_step": modes, "item_shape": list(item)}


def consumed_changed(run_probe: dict[str, Any] | None, ref_probe: dict[str, Any] | None,
                     tol: float) -> tuple[str | None, dict[str, Any]]:
    """Whether the run's training steps consumed other items in all than the reference's: more or fewer than
    `tol` of them apart. A batch read per device where the reference reads it per step (each device given the
    whole batch), half a batch, or other epochs train on other data in all while the curves, averaged over a
    larger or smaller batch, stay within noise. Items are counted in the reference's item shape, so a pmap's
    (devices, per-device batch) layout or micro-batches are the same items."""
    item = _item_shape(ref_probe)
    mine, theirs = consumed_items(run_probe, item), consumed_items(ref_probe, item)
    measured: dict[str, Any] = {"consumed": mine, "reference_consumed": theirs}
    if mine is None or theirs is None or not theirs["items"]:
        return None, measured
    ratio = mine["items"] / theirs["items"]
    measured["consumed_ratio"] = round(ratio, 4)
    if abs(ratio - 1) <= tol:
        return None, measured
    per = "+".join(str(k) for k in mine["per_step"])
    ref_per = "+".join(str(k) for k in theirs["per_step"])
    return (f"the run's training steps consumed {mine['items']} items of shape {tuple(item)} in all ({per} a step "
            f"over {mine['steps']} steps), the reference's {theirs['items']} ({ref_per} a step over {theirs['steps']} "
            f"steps): {ratio:.2f} times as many (within {tol:.0%} allowed), so each update averages over another "
            "batch or the run sees the data another number of times (a batch read per device where the reference "
            "reads one per step, a batch size or an epoch count not the reference's)"), measured


def _batch_words(measured: dict[str, Any]) -> str:
    mine, theirs = measured.get("batches"), measured.get("reference_batches")
    shared = measured.get("shared_data")
    words = "" if shared is None else f"; inputs shared by {shared['across']} {shared['shared']}/{shared['inputs']}"
    words += _dropout_words(measured)
    used = measured.get("consumed")
    if used is not None and measured.get("reference_consumed") is not None:
        words += (f"; items consumed by the training steps {used['items']}, the reference "
                  f"{measured['reference_consumed']['items']}")
    if mine is None and theirs is None:
        return words
    if mine is None or theirs is None:
        side = "the run" if mine is None else "the reference"
        return (f"; repeated batches not compared: {side} fingerprinted fewer than {MIN_BATCHES} training inputs "
                "(data made on the device is not read back)") + words
    return (f"; repeated training inputs {mine['repeats']}/{mine['inputs']}, the reference "
            f"{theirs['repeats']}/{theirs['inputs']}") + words


def dropout_facts(probe: dict[str, Any] | None) -> dict[str, Any] | None:
    """The dropout of a run's training steps over its processes: the rates its layers applied ("on"), the rates of
    layers called without a mask ("off"), whether a layer had rate 0, and whether a training step drew a Bernoulli
    mask by hand (`jax.random.bernoulli`, which Flax's own layer draws too); None when the probe saw no dropout
    layer in training (or reports none: an older probe)."""
    on: set[float] = set()
    off: set[float] = set()
    zero = hand = seen = False
    for p in (probe or {}).get("processes") or []:
        t = (p.get("torch") or {}).get("dropout") or {}
        if t.get("steps") and t.get("layers"):
            seen = True
            on.update(t.get("on") or [])
            off.update(t.get("off") or [])
            zero = zero or bool(t.get("zero_rate"))
        for f in (p.get("jax") or {}).get("functions") or []:
            if not (f.get("train") or f.get("grad")):
                continue
            hand = hand or "bernoulli" in (f.get("draws") or [])
            d = f.get("dropout")
            if d:
                seen = True
                on.update(d.get("on") or [])
                off.update(d.get("off") or [])
                zero = zero or bool(d.get("zero_rate"))
    if not seen:
        return None
    return {"on": sorted(on), "off": sorted(off), "zero_rate": zero, "hand_masks": hand}


def _rates(rates: list[float] | set[float]) -> str:
    return ", ".join(f"{r:g}" for r in sorted(rates))


def dropout_changed(run_probe: dict[str, Any] | None, ref_probe: dict[str, Any] | None) -> tuple[str | None, dict]:
    """Whether the run trains with other dropout than the reference: layers of a rate the reference applies called
    without a mask in its training steps (where the reference's own are not), layers of rate 0 only (no mask drawn by
    hand either), rates that share none with the reference's, or dropout applied where the reference's layers all
    have rate 0. Returns (why, measured); why is None when the dropout agrees or either side's is unknown."""
    mine, theirs = dropout_facts(run_probe), dropout_facts(ref_probe)
    measured = {"dropout": mine, "reference_dropout": theirs}
    if mine is None or theirs is None:
        return None, measured
    ref_on, ref_off = set(theirs["on"]), set(theirs["off"])
    on, off = set(mine["on"]), set(mine["off"])
    switched_off = off - ref_off
    if ref_on and switched_off:
        return (f"dropout is off in the run's training steps: its dropout layers of rate {_rates(switched_off)} ran "
                f"without a mask (deterministic, eval mode, a `train=False` default never overridden)"
                + (f" and it applies {_rates(on)} elsewhere" if on else ", and none applies a mask")
                + f"; the reference trains with dropout {_rates(ref_on)}"), measured
    if ref_on and not on and mine["zero_rate"] and not mine["hand_masks"]:
        return (f"dropout is off in the run's training steps: its dropout layers have rate 0 and none applies a mask; "
                f"the reference trains with dropout {_rates(ref_on)}"), measured
    if ref_on and on and not (ref_on & on):
        return (f"the run trains with dropout {_rates(on)}, the reference with {_rates(ref_on)}: another strength "
                "of regularisation (a keep probability read as a drop rate, a rate from another config)"), measured
    if not ref_on and not ref_off and theirs["zero_rate"] and on:
        return (f"the run trains with dropout {_rates(on)} where the reference's dropout layers all have rate 0"), \
            measured
    return None, measured


def _no_rng_checkpoints(probe: dict[str, Any] | None) -> tuple[int, int]:
    """(checkpointed calls made with preserve_rng_state=False, dropout masks drawn in training inside the first 64
    of them), over the run's processes."""
    calls = masks = 0
    for p in (probe or {}).get("processes") or []:
        c = (p.get("torch") or {}).get("checkpoint_no_rng") or {}
        calls += int(c.get("calls") or 0)
        masks += int(c.get("dropout_calls") or 0)
    return calls, masks


def recomputed_masks(run_probe: dict[str, Any] | None,
                     ref_probe: dict[str, Any] | None) -> tuple[str | None, dict[str, Any]]:
    """Activation checkpointing with `preserve_rng_state=False` around dropout, where the reference's dropout is
    computed once: the backward pass recomputes the forward with the generators as they are then, so its dropout
    masks are new ones and the gradient is not the gradient of the loss the forward computed. Returns (why,
    measured), as dropout_changed does; why is None when it does not apply."""
    (calls, masks), theirs = _no_rng_checkpoints(run_probe), _no_rng_checkpoints(ref_probe)
    measured = {"checkpoint_no_rng": (calls, masks), "reference_checkpoint_no_rng": theirs}
    if not masks or theirs[1]:
        return None, measured
    return (f"activation checkpointing with preserve_rng_state=False around dropout: {calls} checkpointed call(s), "
            f"{masks} dropout mask(s) drawn in training inside them; the backward pass recomputes those layers with "
            "new masks, so each gradient is taken through other masks than the forward's loss (the reference's "
            "dropout is computed once)"), measured


def _dropout_words(measured: dict[str, Any]) -> str:
    mine, theirs = measured.get("dropout"), measured.get("reference_dropout")
    if mine is None or theirs is None:
        return ""
    return f"; dropout applied in training {_rates(mine['on']) or 'none'}, the reference {_rates(theirs['on']) or 'none'}"


def _rebuild_steps(probe: dict[str, Any] | None) -> list[int]:
    return [int(r["step"]) for r in timelines((probe or {}).get("optimizers") or [])[1]]


def _from_seed(probe: dict[str, Any] | None) -> list[str]:
    """The generators the probe saw seeded with a value derived from the run's own seed option (seed + 1,
    seed * 1000 + epoch: ladder/probe/_ladder_probe/seed.py follows the option's value through arithmetic)."""
    out: set[str] = set()
    for p in (probe or {}).get("processes") or []:
        out.update(((p.get("seed") or {}).get("from_seed") or {}).keys())
    return sorted(label.replace("torch.random.", "torch.") for label in out)


def _seeding(probe: dict[str, Any] | None) -> tuple[dict[str, set[int]], bool] | None:
    """The values each seeding function was called with, over every process (torch.random.manual_seed is
    torch.manual_seed), and whether the probe set the seeds itself ([probe] seed = true); None for a probe that
    did not watch them."""
    out: dict[str, set[int]] = {}
    mode = False
    seen = False
    for p in (probe or {}).get("processes") or []:
        s = p.get("seed") or {}
        if "values" not in s:
            continue
        seen, mode = True, mode or bool(s.get("mode"))
        for label, values in s["values"].items():
            out.setdefault(label.replace("torch.random.", "torch."), set()).update(int(v) for v in values)
    return (out, mode) if seen else None


def _drew(probe: dict[str, Any] | None) -> dict[str, bool]:
    """For each global host generator (numpy's, random's, torch's default), whether the run drew from it after it
    was first seen or last seeded, in any process; a generator the probe could not read is left out."""
    out: dict[str, bool] = {}
    for p in (probe or {}).get("processes") or []:
        for label, drew in ((p.get("seed") or {}).get("drew") or {}).items():
            out[label] = out.get(label, False) or bool(drew)
    return out


def drew_before_seed(probe: dict[str, Any] | None) -> dict[str, str]:
    """The global generators a process drew from before it first seeded them, with the program's site of that
    seeding call: torch's only (numpy's is drawn from by libraries at import, jax among them)."""
    out: dict[str, str] = {}
    for p in (probe or {}).get("processes") or []:
        for label, site in ((p.get("seed") or {}).get("before_seed") or {}).items():
            if label == "torch.manual_seed":
                out.setdefault(label, site)
    return out


_GLOBAL_HOST = (("numpy.random.seed", "numpy's global generator (np.random.permutation, np.random.shuffle, ...)"),
                ("random.seed", "Python's random module (random.shuffle, random.random, ...)"))


def entropy_draws(probe: dict[str, Any] | None) -> dict[str, str]:
    """The host generators this run draws from with no seed at all, each with what the probe saw: numpy's or
    random's global generator drawn from by the program's own code while never seeded in its process, and a
    Generator or a global generator set from OS entropy by the program's own code (`np.random.default_rng()`,
    `random.seed()`). Draws and calls made by libraries are left out (jax draws np.random.rand at import). A run
    whose report lacks these facts (an older probe) has none."""
    out: dict[str, str] = {}
    what = dict(_GLOBAL_HOST)
    for p in (probe or {}).get("processes") or []:
        s = p.get("seed") or {}
        for label, d in (s.get("global_draws") or {}).items():
            out.setdefault(label, f"it draws from {what.get(label, label)} and never seeds it ({d.get('first', '?')} "
                                  f"at {d.get('site', '?')}, {d.get('calls', 1)} call(s))")
        for label, u in (s.get("unseeded") or {}).items():
            out.setdefault(f"{label}()",
                           f"{label}() with no seed at {u.get('site', '?')} ({u.get('calls', 1)} call(s))")
    return out


def constant_orders(probe: dict[str, Any] | None) -> dict[str, str]:
    """The data orders this run draws from a generator the program made and never seeded: a DataLoader that
    shuffles with `torch.Generator()` (which starts from torch's fixed default seed, whatever torch.manual_seed
    said), or torch.randperm/randint/multinomial given one, each with where the probe saw it."""
    out: dict[str, str] = {}
    for p in (probe or {}).get("processes") or []:
        for label, c in ((p.get("seed") or {}).get("constant") or {}).items():
            what = c.get("sampler", "sampler")
            what = what if what.startswith(("a DataLoader", "torch.")) else f"a DataLoader's {what}"  # older probes
            out.setdefault(label, f"{what} draws with a {label}() never seeded (at {c.get('site', '?')}, seen "
                                  f"{c.get('calls', 1)} time(s))")
    return out


def _may_draw_unseeded(probe: dict[str, Any] | None) -> set[str]:
    """What the reference may draw with no seed: its own entropy draws and, where its probe did not watch the
    global generators' draws (an older probe), each one it drew from, or may have, in a process that never seeds
    it (unknown counts as drawn: the port is not blamed)."""
    out = set(entropy_draws(probe))
    for p in (probe or {}).get("processes") or []:
        s = p.get("seed") or {}
        if "global_draws" in s:
            continue
        for label, _ in _GLOBAL_HOST:
            if (s.get("drew") or {}).get(label) is not False and label not in (s.get("values") or {}):
                out.add(label)
    return out


def unseeded(run, ref) -> tuple[str | None, dict[str, set[int]]]:  # noqa: ANN001 - RunRecord
    """Whether the run's seed reaches the generators the reference seeds from its own: a seed never passed on
    (a config built with a constant seed) makes runs at different seeds the same run; a generator the
    reference seeds and a port of the same framework leaves alone (torch.manual_seed replaced by a device-only
    seed) draws numbers no seed controls. Values are compared only where the program receives the seed (a value
the probe followed from the seed option through arithmetic, as in PRNGKey(seed + 1), counts as the seed); where
    the probe seeds a self-seeding program ([probe] seed = true), only which generators are seeded. Returns
    (why, the run's seeding values)."""
    mine, theirs = _seeding(run.probe), _seeding(ref.probe if ref is not None else None)
    if mine is None or theirs is None:
        return None, (mine or ({}, False))[0]
    (values, mode), (ref_values, ref_mode) = mine, theirs
    if not (mode or ref_mode) and run.seed is not None and ref.seed is not None:
        ref_with = sorted(label for label, vs in ref_values.items() if int(ref.seed) in vs)
        if ref_with and not any(int(run.seed) in vs for vs in values.values()) and not _from_seed(run.probe):
            calls = "; ".join(f"{label}({', '.join(map(str, sorted(vs)[:3]))})" for label, vs in sorted(values.items()))
            why = (f"the run's seed {run.seed} reaches none of its generators ({calls or 'no seeding call'}), while "
                   f"the reference seeds {', '.join(ref_with)} with its own: the run is the same whatever its seed")
            return why, values
    frameworks = (run.probe or {}).get("frameworks") or {}
    if "torch" in frameworks and "jax" not in frameworks:
        # a device generator (torch.cuda's) has no counterpart on another accelerator: the host's must match. A
        # generator the run never draws from needs no seed (its data order from a torch generator, not numpy's),
        # nor does a numpy Generator the run never makes (default_rng: it draws from none)
        drew = _drew(run.probe)
        missing = sorted(label for label in set(ref_values) - set(values)
                         if not label.startswith("torch.cuda") and label != "numpy.random.default_rng"
                         and drew.get(label) is not False)
        if missing:
            return (f"the reference seeds {', '.join(missing)} and the run never does (it seeds "
                    f"{', '.join(sorted(values)) or 'nothing'}): what those generators draw (initial weights, data "
                    "order) no seed controls"), values
    ref_early = drew_before_seed(ref.probe if ref is not None else None)
    early = {label: site for label, site in drew_before_seed(run.probe).items() if label not in ref_early}
    if early:
        label, site = next(iter(early.items()))
        return (f"the run draws from torch's global generator before it first seeds it ({label} at {site}): what it "
                "drew first (the initial weights of a model built before the seeding call) follows torch's own "
                "start-up seed, not the run's, while the reference seeds before it draws"), values
    theirs_unseeded = _may_draw_unseeded(ref.probe if ref is not None else None)
    fresh = {label: why for label, why in entropy_draws(run.probe).items() if label not in theirs_unseeded}
    if fresh:
        return (f"the run draws random numbers no seed controls, where the reference does not: "
                f"{'; '.join(fresh.values())}. What they decide (the data order, a noise sample) is new OS entropy "
                "in every run: two runs at the same seed differ, and each looks like another seed"), values
    theirs_constant = constant_orders(ref.probe if ref is not None else None)
    constant = {label: why for label, why in constant_orders(run.probe).items() if label not in theirs_constant}
    if constant:
        return (f"the run's data order is the same at every seed, where the reference's follows its seed: "
                f"{'; '.join(constant.values())}. A new torch.Generator starts from torch's fixed default seed "
                "(67280421310721) whatever torch.manual_seed said: seed it from the run's seed "
                "(torch.Generator().manual_seed(seed)) or leave generator=None"), values
    return None, values


@register("L1", NAME)
def randomness(ctx: CheckContext) -> CheckResult:
    probe = ctx.run.probe
    if probe is None:
        return not_checked("L1", NAME, "no probe report: the run's random draws are unknown")
    facts = _facts(probe)
    unseeded_why, seeding = unseeded(ctx.run, ctx.reference())
    if unseeded_why:
        return CheckResult(level="L1", name=NAME, status="failed", measured={"seeded": False},
                           threshold={"seeded": True}, evidence=unseeded_why,
                           details={"run": {k: sorted(v) for k, v in seeding.items()}})
    ref = ctx.reference()
    drop_why, drop = dropout_changed(probe, ref.probe if ref is not None else None)
    if drop_why:
        return CheckResult(level="L1", name=NAME, status="failed", measured=drop,
                           threshold={"dropout": (drop["reference_dropout"] or {}).get("on")}, evidence=drop_why)
    masks_why, masks = recomputed_masks(probe, ref.probe if ref is not None else None)
    if masks_why:
        return CheckResult(level="L1", name=NAME, status="failed", measured={"checkpoint_no_rng": masks[
            "checkpoint_no_rng"]}, threshold={"checkpoint_no_rng": masks["reference_checkpoint_no_rng"]},
            evidence=masks_why)
    batch_why, batch = repeated_batches(probe, ref.probe if ref is not None else None,
                                        ctx.protocol.l1.batch_repeat_excess)
    if batch_why:
        return CheckResult(level="L1", name=NAME, status="failed", measured=batch,
                           threshold={"batch_repeat_share": batch["batch_repeat_bound"]}, evidence=batch_why)
    shard_why, shards = shared_shards(probe, ref.probe if ref is not None else None,
                                      ctx.protocol.l1.batch_repeat_excess)
    if shard_why:
        return CheckResult(level="L1", name=NAME, status="failed", measured={**batch, **shards},
                           threshold={"shared_data_share": shards["shared_data_bound"]}, evidence=shard_why)
    items_why, items = consumed_changed(probe, ref.probe if ref is not None else None, ctx.protocol.l1.items_rel_tol)
    if items_why:
        return CheckResult(level="L1", name=NAME, status="failed", measured={**batch, **items},
                           threshold={"consumed_ratio": [1 - ctx.protocol.l1.items_rel_tol,
                                                         1 + ctx.protocol.l1.items_rel_tol]}, evidence=items_why)
    if shards.get("shared_data") is not None:
        batch = {**batch, **shards}
    if items.get("consumed") is not None:
        batch = {**batch, **items}
    if drop["dropout"] is not None:
        batch = {**batch, **drop}
    if facts is None:
        both = batch.get("batches") is not None and batch.get("reference_batches") is not None
        if both or (batch.get("dropout") is not None and batch.get("reference_dropout") is not None):
            return CheckResult(level="L1", name=NAME, status="passed", measured=batch,
                               threshold={"batch_repeat_share": batch.get("batch_repeat_bound")},
                               evidence="no JAX random numbers drawn while training" + _batch_words(batch))
        return CheckResult(level="L1", name=NAME, status="not_applicable",
                           evidence="the run drew no JAX random numbers while training (torch's generators advance "
                                    "by themselves; initialisation and evaluation draws are the program's choice)"
                                    + _batch_words(batch))
    min_calls = ctx.protocol.l1.random_repeat_calls
    again: list[str] = []
    mine = repeats(facts, min_calls, _rebuild_steps(probe), again)
    theirs = repeats(_facts(ref.probe if ref is not None else None), min_calls,
                     _rebuild_steps(ref.probe if ref is not None else None))
    measured = {"step_draws": len(facts.get("step_draws") or []), "host_draw_sites": len(facts.get("host_draws") or []),
                "repeats": len(mine), "reference_repeats": len(theirs), **batch}
    details = {"run": facts, "reference": _facts(ref.probe if ref is not None else None)}
    if len(mine) > len(theirs):
        return CheckResult(level="L1", name=NAME, status="failed", measured=measured,
                           threshold={"repeats": len(theirs), "min_calls": min_calls},
                           evidence="; ".join(mine) + (f" (the reference repeats {len(theirs)})" if theirs else
                                                       " (the reference draws anew each time)"), details=details)
    n = measured["step_draws"] + measured["host_draw_sites"]
    return CheckResult(level="L1", name=NAME, status="passed", measured=measured,
                       threshold={"repeats": len(theirs), "min_calls": min_calls},
                       evidence=f"{n} random draw site(s) while training, each with a new key per step"
                                + (f"; the reference repeats as much: {theirs[0]}" if theirs else "")
                                + (f"; the initial draws at {', '.join(again[:3])} made again where the optimizer was "
                                   "built anew (a checkpoint resumed into a fresh model)" if again else "")
                                + _batch_words(batch),
                       details=details)
