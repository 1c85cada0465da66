"""Batch fingerprints: which data each training forward (torch) or training step (JAX) is given, as a 32-bit
checksum (CRC-32) of a strided sample of each input's bytes, so that a run that trains on the same batch twice (DataLoader workers
seeded alike, an iterable dataset every worker yields whole, a prefetched batch used again) can be told from one
that draws a new batch each step (ladder.checks.randomness compares the repeats with the reference's).

Only values already in host memory are hashed: a CPU tensor or numpy array, a JAX array on the CPU backend, or a
device tensor the probe saw being copied from the host (`Tensor.to`, torch_xla's `_xla_tensors_from_aten` under
MpDeviceLoader, `jax.device_put`), which is hashed from its host source at the copy. A device value made on the
device is not read back (that would add a transfer and, on XLA, change the graph): such an input counts as
unmeasured. At most MAX_SAMPLE elements of each input are hashed, so the cost does not grow with the batch.
"""

from __future__ import annotations

import collections
import threading
import weakref
import zlib

import _ladder_probe as core

MAX_FPS = 3000  # fingerprints kept per process (the first ones: a short run is judged)
MAX_SAMPLE = 1024  # elements hashed per input, strided over the whole input
MIN_SIZE = 16  # inputs with fewer elements (a step number, a key, a learning rate) are not data
_MAX_COPIES = 256  # device copies remembered with their host source's hash (the most recent)
_HOST_COPIES = 4096  # device copies remembered with their host source's Sums while they live (the inputs' moments)
MOMENT_ELEMENTS = 1 << 22  # input elements summed per place (role, width, source): a short run's, bounded
MOMENT_MAX_WIDTH = 4096  # inputs with more elements per item are not summed (the report keeps every feature)
_MAX_MOMENT_KEYS = 8  # places per role
_MAX_MOMENT_STEPS = 64  # distinct steps counted per evaluation place

_s: dict = {}
_lock = threading.Lock()


def reset() -> None:
    _s.clear()
    _s.update(fps=[], sources={}, unmeasured=0, copies=collections.OrderedDict(), chunked=0, replicated=0,
              first_replicated=None, devices=0, sizes={}, size_steps=0, size_step=None, size_notes=[], last={},
              prev_input=None, after=[0, 0], pending=None, after_checks=0, in_step={}, moments={},
              moments_full={}, train_crcs=set(), last_eval=None,
              hosts=collections.OrderedDict())


reset()


def full() -> bool:
    """Whether no more fingerprints are kept: the callers then skip hashing altogether."""
    return len(_s["fps"]) >= MAX_FPS


def _part(a, size: int, shape, dtype) -> bytes:
    """The bytes hashed for an array of `size` elements: its shape and dtype (formatted once per kind of input),
    then all its elements or, past MAX_SAMPLE, a strided sample of them."""
    raw = a.tobytes() if size <= MAX_SAMPLE else a.reshape(-1)[::size // MAX_SAMPLE][:MAX_SAMPLE].tobytes()
    key = (shape, dtype)
    head = _HEADS.get(key)
    if head is None:
        head = repr((tuple(shape), str(dtype))).encode()
        if len(_HEADS) < 256:  # inputs of ever new shapes (sequences of every length) are formatted each time
            _HEADS[key] = head
    return head + raw


_HEADS: dict = {}  # (shape, dtype) -> the bytes a part starts with


def numpy_part(a) -> bytes | None:
    """The hashed bytes of a numpy array: its shape, dtype and a strided sample of its elements."""
    size = int(getattr(a, "size", 0))
    if size < MIN_SIZE:
        return None
    return _part(a, size, a.shape, a.dtype)


def torch_part(t) -> bytes | None:
    """The same for a CPU tensor, read through numpy without a copy (torch's own `numpy`, not the probe's counted
    read; a dtype numpy lacks, bfloat16, viewed as int16): a few tensor ops cost more than the hash. The header
    names torch's shape and dtype."""
    size = t.numel()
    if size < MIN_SIZE:
        return None
    to_numpy = _to_numpy()
    src = t.detach() if t.requires_grad else t
    try:
        a = to_numpy(src)
    except TypeError:  # bfloat16 and other dtypes numpy has no name for: the same bytes, as ints
        import torch

        a = to_numpy(src.view({1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}[src.element_size()]))
    return _part(a, size, t.shape, t.dtype)


def _to_numpy():
    """torch's own `Tensor.numpy` (not the probe's counted read), looked up once."""
    to_numpy = _s.get("to_numpy")
    if to_numpy is None:
        import torch

        to_numpy = _s["to_numpy"] = getattr(torch.Tensor.numpy, "__wrapped__", torch.Tensor.numpy)
    return to_numpy


def torch_host(t):
    """A floating tensor's values as a numpy array without a copy (a CPU tensor read in place), or a device tensor's
    Sums taken from the host source the probe saw it copied from; None otherwise (a dtype numpy lacks, a value made
    on the device)."""
    if not t.is_cpu:
        return copied_sums(t)
    if not t.is_floating_point() or t.element_size() < 2 or str(t.dtype) == "torch.bfloat16":
        return None
    to_numpy = _to_numpy()
    return to_numpy(t.detach() if t.requires_grad else t)


def remember_copy(dev_value, part: bytes | None) -> None:
    """A device value copied from host data whose hashed bytes are `part`: looked up when it is an input."""
    if part is None:
        return
    try:
        ref = weakref.ref(dev_value)
    except TypeError:
        ref = None  # not weakly referenceable: the id alone (checked against nothing)
    _keep(_s["copies"], id(dev_value), (ref, part), _MAX_COPIES)


def _keep(table: collections.OrderedDict, key: int, value: tuple, most: int) -> None:
    """Puts `value` last in `table`, dropping the oldest entries beyond `most`."""
    with _lock:
        table[key] = value
        table.move_to_end(key)
        while len(table) > most:
            table.popitem(last=False)


class Sums(tuple):
    """An input's rows, width and per-feature sum and sum of squares (float64), taken when it was copied to a device."""


def _sums(host):
    """A host array's Sums, or None where its moments are not kept (not floating, fewer than 2 dimensions, items of
    fewer than 2 or more than MOMENT_MAX_WIDTH elements)."""
    if getattr(host, "ndim", 0) < 2 or host.dtype.kind != "f" or not host.shape[0]:
        return None
    rows = int(host.shape[0])
    width = int(host.size) // rows
    if not 2 <= width <= MOMENT_MAX_WIDTH:
        return None
    x = host.reshape(rows, width).astype("float64")
    return Sums((rows, width, x.sum(axis=0), (x * x).sum(axis=0)))


def remember_host(dev_value, host) -> None:
    """A device value copied from the host array `host` (numpy): its Sums kept while the value lives (a split put
    on the device once and evaluated every epoch keeps them; a batch's go when it is freed), at most _HOST_COPIES of
    them, while the inputs' moments are still summed, so an input on the device is summed from its host source.
    Taken at the copy (a loader copies ahead of the step, in its own thread), not read back from the device."""
    if host is None or not wants_moments():
        return
    sums = _sums(host)
    if sums is None:
        return
    key = id(dev_value)
    hosts = _s["hosts"]

    def forget(ref, key=key):  # the value was freed: no lock here, a collection may run inside the locked block
        try:
            hit = hosts.get(key)
            if hit is not None and hit[0] is ref:
                hosts.pop(key, None)
        except Exception:  # never into the program
            pass

    try:
        ref = weakref.ref(dev_value, forget)
    except TypeError:
        return
    _keep(hosts, key, (ref, sums), _HOST_COPIES)


def copied_sums(dev_value) -> Sums | None:
    hit = _s["hosts"].get(id(dev_value))
    if hit is None or hit[0]() is not dev_value:
        return None
    return hit[1]


def copied_part(dev_value) -> bytes | None:
    hit = _s["copies"].get(id(dev_value))
    if hit is None:
        return None
    ref, part = hit
    if ref is not None and ref() is not dev_value:
        return None  # another value now has that id
    return part


def note(parts: list, source: str, step: int) -> None:
    """One training input of training step `step`: the hashed parts of its values. One value that could not be
    measured (None) leaves the whole input unmeasured: the values measured may be the constant ones (a mask, the
    positions) beside a batch made on the device, and alone they would read as the same input every step."""
    try:
        if not parts:
            return
        if any(p is None for p in parts):
            _s["unmeasured"] += 1
            return
        fps = _s["fps"]
        if len(fps) >= MAX_FPS:
            return
        # CRC-32 chained over the parts (each part starts with its shape and dtype): one 32-bit checksum at several
        # GB/s, where blake2b of the earlier 16 KB sample cost 18-25 us, a twentieth of a small step. Two of a run's
        # 3000 inputs at most share it by chance with odds of about 1 in 1000: one false repeat, against a margin of
        # 5% of the inputs
        crc = 0
        for p in parts:
            crc = zlib.crc32(p, crc)
        fps.append([step, f"{crc:08x}"])
        _new_input(crc, parts, step)
        _s["sources"][source] = _s["sources"].get(source, 0) + 1
    except Exception as e:  # never into the program
        core.record_error("batch fingerprint", e)


# ---------------------------------------------------------------- the training batch evaluated after its update

# A port that logs the loss of the weights after the update (the Flax examples' `compute_metrics(state.params, batch)`
# called after the step, or the same metrics computed at the end of the step on the rebound parameters) logs another
# quantity than the loss the gradient was taken at, lower while the rate is large. Seen two ways: a call that is not
# a training step given the last step's batch again before the next step (fingerprints, as above), and a matmul inside
# the training step whose operand is a parameter `optax.apply_updates` returned (jax_facts, note_in_step).
_AFTER_CHECKS = 2  # calls checked after each training step (the first ones: the metrics call follows the step)


def _new_input(crc: int, parts: list, step: int) -> None:
    """A training input of step `step` (its checksum and hashed parts): when it starts a new step with a new batch,
    that step is judged, and counted as evaluated after the update when a call gave the previous step's batch in
    between. The parts' own checksums are taken only when a call is checked (note_after), not at every step."""
    prev = _s["prev_input"]
    if prev is not None and prev[0] != step:
        _s["after_checks"] = 0
        if crc != prev[1]:  # the same batch every step (full-batch training): before and after cannot be told
            _s["after"][0] += 1
            if _s["pending"] == prev[0]:
                _s["after"][1] += 1
    _s["prev_input"] = [step, crc, parts, None]  # the last slot: the parts' checksums, once a call needs them


def note_after(parts: list, step: int) -> None:
    """A call that is not a training step (a jitted metrics function, the model's forward outside training), made
    while the clock reads `step`, given values whose hashed parts are `parts` (None: not measured)."""
    try:
        prev = _s["prev_input"]
        if prev is None or prev[0] != step or _s["pending"] == step or _s["after_checks"] >= _AFTER_CHECKS:
            return
        _s["after_checks"] += 1
        if prev[3] is None:
            prev[3] = frozenset(zlib.crc32(p) for p in prev[2])
        crcs = {zlib.crc32(p) for p in parts if p is not None}
        if prev[3] and prev[3] <= crcs:
            _s["pending"] = step
    except Exception as e:  # never into the program
        core.record_error("batch after update", e)


def checking_after(step: int) -> bool:
    """Whether a call made at `step` would be checked (callers skip hashing otherwise)."""
    prev = _s["prev_input"]
    return prev is not None and prev[0] == step and _s["pending"] != step and _s["after_checks"] < _AFTER_CHECKS


def note_in_step(rec: dict, matmuls: int) -> None:
    """A training step's trace computes `matmuls` matmuls with parameters the update just returned; `rec` is the
    step function's record (its calls are read at exit)."""
    _s["in_step"][rec["name"]] = (rec, matmuls)


# ---------------------------------------------------------------- the inputs' moments, per feature

# How the evaluation inputs relate to the training inputs, feature by feature: a port that standardises its test
# split with the test split's own statistics (a pipeline that fits its normaliser on the split it reads), or not at
# all, or twice, evaluates on inputs shifted against the ones it trained on, by an amount the metric may hide in seed
# noise. Per role (training, evaluation) and width (elements per item), the count, sum and sum of squares of every
# feature, in float64 (ladder.checks.l1 relates the two roles and compares the relation with the reference's).


def wants_moments(role: str | None = None) -> bool:
    """Whether inputs of `role` (either, for None) may still be summed: until the role holds _MAX_MOMENT_KEYS
    places, all of them full."""
    return any(not _s["moments_full"].get(r) for r in ((role,) if role else ("train", "eval")))


def note_moments(arrays: list, parts: list, role: str, source: str = "", step: int = 0) -> None:
    """One input's host arrays (numpy, or the Sums of a device copy; None where neither) and their hashed parts, as
    the training step (`role` "train") or a call that is not a training step ("eval", `source` naming the function,
    made while the clock reads `step`) is given them. Floating arrays with items of 2 to MOMENT_MAX_WIDTH elements
    count, each place (role, width, source) up to MOMENT_ELEMENTS elements. An evaluation array that is a training
    input again (a metrics call on the training batch) does not count, nor one given before the first training step
    (data prepared by a jitted function)."""
    try:
        if role == "eval" and step < 1:
            return
        if role == "eval":  # the same input twice in a row at one step (a wrapper's forward, then its module's):
            crc = step  # once; the same split evaluated again at a later step counts again
            for p in parts:
                crc = zlib.crc32(p or b"", crc)
            if (crc, step) == _s["last_eval"] and any(parts):
                return
            _s["last_eval"] = (crc, step)
        moments, crcs = _s["moments"], _s["train_crcs"]
        for a, part in zip(arrays, parts):
            if a is None:
                continue
            if isinstance(a, Sums):
                rows, width = a[0], a[1]
            elif getattr(a, "ndim", 0) < 2 or a.dtype.kind != "f" or not a.shape[0]:
                continue
            else:
                rows = int(a.shape[0])
                width = int(a.size) // rows
                if width < 2 or width > MOMENT_MAX_WIDTH:
                    continue
            if part is not None:
                crc = zlib.crc32(part)
                if role == "eval" and crc in crcs:
                    continue
                if role == "train" and len(crcs) < MAX_FPS * 4:
                    crcs.add(crc)
            key = f"{role}:{width}" + (f":{source}" if source else "")
            m = moments.get(key)
            if m is None:
                if sum(k.startswith(role) for k in moments) >= _MAX_MOMENT_KEYS:
                    continue
                import numpy as np

                m = moments[key] = [0, np.zeros(width), np.zeros(width), set(), MOMENT_ELEMENTS, None, None]
            if len(m[3]) <= _MAX_MOMENT_STEPS:
                m[3].add(step)
            if m[4] <= 0:
                continue
            _add(m, a, rows, width)
            if m[4] <= 0:
                mine = [v for k, v in moments.items() if k.startswith(role)]
                _s["moments_full"][role] = len(mine) >= _MAX_MOMENT_KEYS and all(v[4] <= 0 for v in mine)
    except Exception as e:  # never into the program
        core.record_error("input moments", e)


def _add(m: list, a, rows: int, width: int) -> None:
    """Adds an input to a place's sums, taken about a shift (the place's first row) so that the squares do not cancel
    for data far from zero: in float32 for a float32 batch of at most 1024 rows (two einsums, a third of the float64
    path's time), in float64 otherwise; a device copy's Sums (float64, unshifted) moved onto the shift."""
    import numpy as np

    if isinstance(a, Sums):
        if m[5] is None:
            m[5] = a[2] / a[0]
        n, c = a[0], m[5]
        s1, s2 = a[2] - n * c, a[3] - 2 * c * a[2] + n * c * c
    else:
        x = a.reshape(rows, width)
        if x.size > m[4]:
            x = x[:max(1, m[4] // width)]
        if m[5] is None:
            m[5] = x[0].astype("float64")
        n = x.shape[0]
        if x.dtype == np.float32 and n <= 1024:
            if m[6] is None:
                m[6] = m[5].astype(np.float32)
            d = x - m[6]
            s1, s2 = np.einsum("ij->j", d), np.einsum("ij,ij->j", d, d)
        else:
            d = x.astype("float64") - m[5]
            s1, s2 = d.sum(axis=0), (d * d).sum(axis=0)
    m[0] += n
    m[1] += s1
    m[2] += s2
    m[4] -= n * width


def _moments_out() -> dict:
    """Per place, the rows summed and every feature's mean and standard deviation; an evaluation place also the
    number of training steps after which it was called (at most _MAX_MOMENT_STEPS + 1 are counted) and of the
    process's training steps."""
    out = {}
    for key, (n, s1, s2, steps, _, shift, _) in _s["moments"].items():
        if n < 2:
            continue
        off = s1 / n
        mean = shift + off
        sd = (s2 / n - off * off).clip(min=0) ** 0.5
        out[key] = {"rows": n, "mean": [float(f"{v:.9g}") for v in mean], "sd": [float(f"{v:.6g}") for v in sd]}
        if key.startswith("eval"):
            out[key].update(steps=len(steps), of=core.clock.step)
    return out


def note_chunks(arrays: list, devices: int, step: int) -> None:
    """A training step's host data (numpy arrays) on a process with `devices` local devices: whether every array is
    `devices` equal chunks along its first axis, the slices a pmap or a batch-sharded jit hands each device. A real
    batch never is; one shard copied to every device (each device's slice picked by an index that is the same on all
    of them) always is. Arrays whose first axis does not split into `devices` chunks leave the step unjudged."""
    try:
        if devices < 2 or not arrays or _s["chunked"] >= MAX_FPS:
            return
        same = True
        for a in arrays:
            if a.ndim == 0 or a.shape[0] < devices or a.shape[0] % devices:
                return
            rows = a.reshape(devices, -1)
            width = rows.shape[1]
            if width * devices < MIN_SIZE:
                return
            sample = rows[:, ::max(1, width * devices // MAX_SAMPLE)]
            first = sample[0].tobytes()
            if any(sample[i].tobytes() != first for i in range(1, devices)):
                same = False
                break
        _s["chunked"] += 1
        _s["devices"] = devices
        if same:
            _s["replicated"] += 1
            if _s["first_replicated"] is None:
                _s["first_replicated"] = step
    except Exception as e:  # never into the program
        core.record_error("batch chunks", e)


MAX_SIGNATURES = 64  # distinct per-step shapes kept (then counted as "other")


def note_shapes(values: list, place: str, step: int) -> None:
    """The shapes of one training input's data values (a forward call's tensors, a jitted step's data leaves), for
    the items each optimizer step consumes (ladder.checks.randomness compares them with the reference's: a batch
    read per device instead of per step, half a batch, more epochs). No value is read. A value that is the very
    object the previous step at the same place was given (a whole dataset handed to every step beside the indices)
    is not a batch and is left out; the previous step's values are held weakly, so an address used again by a new
    batch does not count as the same object."""
    try:
        shapes, last, now = [], _s["last"], {}
        for i, v in enumerate(values):
            key = f"{place}:{i}"
            ref = last.get(key)
            if ref is not None and ref() is v:
                now[key] = ref
                continue
            try:
                now[key] = weakref.ref(v)
            except TypeError:
                pass
            shapes.append([int(d) for d in v.shape])
        last.update(now)
        if _s["size_step"] != step:
            _flush_shapes()
            _s["size_step"] = step
        _s["size_notes"].append(shapes)
    except Exception as e:  # never into the program
        core.record_error("batch shapes", e)


def _flush_shapes() -> None:
    notes = _s["size_notes"]
    if not notes:
        return
    key = repr(notes)  # a step's shapes, as a dict key
    sizes = _s["sizes"]
    if key not in sizes and len(sizes) >= MAX_SIGNATURES:
        key, notes = "other", None
    sizes.setdefault(key, [notes, 0])[1] += 1
    _s["size_steps"] += 1
    _s["size_notes"] = []


def snapshot() -> dict:
    _flush_shapes()
    moments = _moments_out()
    if not _s["fps"] and not _s["unmeasured"] and not _s["size_steps"] and not _s["in_step"] and not moments:
        return {}
    out = {"fps": list(_s["fps"]), "sources": dict(_s["sources"]), "unmeasured": _s["unmeasured"], "max_fps": MAX_FPS}
    if _s["size_steps"]:
        out["shapes"] = {"steps": _s["size_steps"],
                         "per_step": sorted(_s["sizes"].values(), key=lambda notes_n: -notes_n[1])}
    judged, evaluated = _s["after"]
    in_step = {name: {"matmuls": m, "calls": rec.get("calls", 0)} for name, (rec, m) in _s["in_step"].items()}
    if judged or in_step:
        out["after_update"] = {"judged": judged, "evaluated": evaluated, "in_step": in_step}
    if moments:
        out["moments"] = moments
    if _s["chunked"]:
        out["chunks"] = {"devices": _s["devices"], "inputs": _s["chunked"], "replicated": _s["replicated"],
                         "first": _s["first_replicated"]}
    return {"batches": out}
