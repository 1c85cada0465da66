"""JAX facts: the backend and its devices, compilations (with the training step they happened at),
host reads of jax.Arrays and host callbacks run from compiled code, the calls of every jitted function,
and the training-step clock.

The clock: JAX has no optimizer hook, so `jax.jit` and `jax.pmap` are wrapped. The wrapped function
traces the user's function with a small context around it; when the optimizer update (optax_facts) is
traced inside it, that function is the training step, and each host call of it is one step (in a program
whose update no optax transformation makes, the function that applies jax.grad / value_and_grad). The same
context carries the gradient and parameter norms that the update computed out as one extra output of the
step (a tuple of scalars), so they are recorded without a host callback inside the step and without a
second trace: the step compiles exactly as often as without the probe. Values stay on the device until
exit. Ahead-of-time use (`jax.jit(f).lower(...).compile()`) is followed through its stages: the executable
compiled from the wrapped function, called, counts as a call of it (a step compiled before the loop is
measured as one jitted in it). A function whose update is traced under a nested transformation (shard_map,
scan, vmap) counts steps but cannot hand its norms out; the report says so.

Random draws: the key-consuming jax.random functions are wrapped. A draw traced in the training step hands
its key data out beside the norms (kept for the first few calls), so the report can say whether each call
drew with a new key; a draw on the host while training is fingerprinted at its call site, so a key used
again at a later step (a shuffle with the same key each epoch) is counted.
"""

from __future__ import annotations

import functools
import itertools
import sys
import threading
import time

import _ladder_probe as core
from _ladder_probe import batches

SNAPSHOT_ORDER = 1
_MAX_BY_STEP = 5000
_KEYS_KEPT = 8  # step calls whose random draws' keys are kept
_MAX_STEP_DRAWS = 16
_MAX_HOST_SITES = 64
_s: dict = {}
_tls = threading.local()


def reset() -> None:
    functions = _s.get("functions", [])  # wrapped functions outlive a fork: the child starts their counts anew
    for rec in functions:
        rec.update(calls=0, by_step={}, keys=[], upd_calls=0, upd_windows={}, upd_last=[])
    _s.clear()
    _s.update(backend=None, platforms=[], device_count=None, compiles=[], cache_hits=[], functions=functions,
              host_reads_hooked=None, host_draws={})


reset()


# ---------------------------------------------------------------- tracing context

class Box:
    """What one trace of a wrapped function learns: whether the optimizer update ran inside it, and the
    norms it computed (tracers of this trace) to hand out as an extra output."""

    __slots__ = ("trace", "update_seen", "grad_seen", "aux", "nested", "owner", "no_trace", "draws", "compute",
                 "grad_io", "dropout", "updated", "after_matmuls")

    def __init__(self, owner) -> None:
        self.owner = owner
        self.update_seen = False
        self.grad_seen = False  # jax.grad / value_and_grad applied in this trace (a hand-written update's step)
        self.aux = None
        self.nested = False
        self.no_trace = None  # why this JAX cannot tell the current trace (older than unsafe_get_current_trace)
        self.draws: list = []  # (function, key data) of each random draw made in this trace itself
        self.compute: dict = {}  # operand dtype -> count, over the matmuls and convolutions bound in this trace
        self.grad_io: list = []  # (parameters, gradient) of each jax.grad / value_and_grad applied in this trace
        self.dropout: list = []  # (rate, on) of each Flax dropout layer called in this trace
        self.updated: dict = {}  # id -> tracer: the parameters optax.apply_updates returned here, and views of them
        self.after_matmuls = 0  # matmuls and convolutions in this trace with an updated parameter as an operand
        try:
            from jax._src import core as jcore

            self.trace = jcore.unsafe_get_current_trace()
        except Exception as e:
            self.trace = None
            self.no_trace = f"{type(e).__name__}: {e}"[:200]

    def offer(self, aux) -> None:
        """The update's norms, if they belong to this trace (not to a transformation nested in it)."""
        self.update_seen = True
        if self.aux is not None:
            return
        leaf = aux[0]
        if self.trace is not None and getattr(leaf, "_trace", None) is self.trace:
            self.aux = aux
        else:
            self.nested = True


def _stack() -> list:
    st = getattr(_tls, "stack", None)
    if st is None:
        st = _tls.stack = []
    return st


def current_box() -> Box | None:
    st = _stack()
    return st[-1] if st else None


class Aux:
    """The step's output with the probe's norms, the key data of its random draws and the samples of a
    hand-written update beside it (a pytree node, unpacked before the program sees the output)."""

    __slots__ = ("out", "aux", "keys", "upd")

    def __init__(self, out, aux, keys=None, upd=None) -> None:
        self.out, self.aux, self.keys, self.upd = out, aux, keys, upd


def _register_aux(jax) -> None:
    jax.tree_util.register_pytree_node(Aux, lambda a: ((a.out, a.aux, a.keys, a.upd), None), lambda _, c: Aux(*c))


# ---------------------------------------------------------------- jit / pmap

def _rows(args) -> int | None:
    """The leading size of the last positional argument (the batch, by the usual habit)."""
    if not args:
        return None
    a = args[-1]
    for _ in range(4):
        shape = getattr(a, "shape", None)
        if shape is not None:
            return int(shape[0]) if len(shape) else None
        if isinstance(a, dict) and a:
            a = a[sorted(a, key=str)[0]]
        elif isinstance(a, (list, tuple)) and a:
            a = a[0]
        else:
            return None
    return None


class Traced:
    """What `jax.jit(fun)` / `jax.pmap(fun)` return under the probe: the real jitted function of `fun`
    (traced inside a context), with the same call, attributes and signature."""

    def __init__(self, original, fun, kwargs: dict, kind: str) -> None:
        self._original, self._fun, self._kwargs, self._kind = original, fun, kwargs, kind
        self._plain = None
        name = getattr(fun, "__name__", None) or type(fun).__name__
        self._rec = {"name": f"{kind}({name})", "calls": 0, "train": False, "traces": 0, "nested": False,
                     "by_step": {}, "keys": [], "draws": []}
        core.append(_s["functions"], self._rec, 500)
        # out_shardings given (flax's nnx.jit always passes a tuple of them): the output is always an Aux and the
        # shardings its prefix, the probe's outputs left unconstrained; the program's outputs keep theirs
        self._wrap_out = kind == "jit" and "out_shardings" in kwargs
        self._aux_ok = kind == "jit" or kwargs.get("out_axes", 0) == 0
        jit_kwargs = dict(kwargs)
        if self._wrap_out:
            jit_kwargs["out_shardings"] = Aux(kwargs["out_shardings"], None, None, None)
        self._jitted = original(self._make_traced(fun), **jit_kwargs)
        try:
            functools.update_wrapper(self, fun)
        except Exception:
            pass

    def _make_traced(self, fun):
        rec = self._rec

        def traced(*args, **kwargs):
            box = Box(self)
            st = _stack()
            st.append(box)
            try:
                out = fun(*args, **kwargs)
            finally:
                st.pop()
            rec["traces"] += 1
            _merge_compute(rec, box, st)
            if box.dropout:
                _merge_dropout(rec, box, st)
            if box.grad_io and (box.update_seen or box.grad_seen):
                try:
                    _note_data_dtypes(rec, box, args, kwargs)
                except Exception as e:
                    core.record_error("jax step argument dtypes", e)
            if box.after_matmuls and box.update_seen:
                batches.note_in_step(rec, box.after_matmuls)
            if box.update_seen:
                rec["train"] = True
                _s["update_ever"] = True
            if box.grad_seen:
                rec["grad"] = True
            if box.nested and box.no_trace is not None:
                if core.grad_norms.why_missing is None:
                    version = getattr(sys.modules.get("jax"), "__version__", "?")
                    core.grad_norms.why_missing = (f"this JAX ({version}) does not tell the probe the current trace "
                                                   f"({box.no_trace}): gradient norms are not supported on it")
            elif box.nested:
                rec["nested"] = True
                if core.grad_norms.why_missing is None:
                    core.grad_norms.why_missing = (f"the optimizer update of {rec['name']} is traced under a "
                                                   "nested transformation (shard_map, scan, vmap)")
            keys = None
            if box.draws and (box.update_seen or box.grad_seen):  # a training step's draws: their keys go out
                rec["draws"] = [name for name, _ in box.draws]
                keys = tuple(k for _, k in box.draws)
            upd = None
            if box.grad_io and self._aux_ok:  # an optax step too: its update replayed where its settings differ
                try:
                    upd = _update_io(rec, box)
                except Exception as e:
                    core.record_error("jax update samples", e)
            if (box.aux is not None or keys or upd is not None) and self._aux_ok or self._wrap_out:
                return Aux(out, box.aux, keys, upd)
            return out

        try:
            functools.update_wrapper(traced, fun)  # jit reads the signature (static_argnames) through it
        except Exception:
            pass
        return traced

    def __call__(self, *args, **kwargs):
        return self._call(self._jitted, args, kwargs)

    def _call(self, fn, args, kwargs):
        """A call of the jitted function, or of an executable compiled ahead of time from it (`fn`)."""
        outer = current_box()
        if outer is not None:  # called while another function is traced: not a host call
            res = fn(*args, **kwargs)
            if type(res) is Aux:
                if res.aux is not None:
                    outer.offer(res.aux)
                return res.out
            if self._rec["train"]:
                outer.update_seen = True
            if self._rec.get("grad"):
                outer.grad_seen = True
            return res
        rec = self._rec
        ticked = False
        if _is_step(rec):
            core.clock.tick("jax training step")
            ticked = True
        res = fn(*args, **kwargs)
        try:
            rec["calls"] += 1
            if _is_step(rec) and not ticked:  # learnt while tracing this first call
                core.clock.tick("jax training step")
            if _is_step(rec):
                try:
                    _note_batch(rec, args, kwargs)
                except Exception as e:
                    core.record_error("jax batch fingerprint", e)
            if not _is_step(rec):
                try:
                    _note_after(rec, args, kwargs)
                except Exception as e:
                    core.record_error("jax batch after update", e)
                b = rec["by_step"].get(core.clock.step)
                if b is None and len(rec["by_step"]) < _MAX_BY_STEP:
                    b = rec["by_step"][core.clock.step] = [0, 0]
                if b is not None:
                    b[0] += 1
                    b[1] += _rows(args) or 0
            if type(res) is Aux:
                if res.aux is not None:
                    _keep(res.aux)
                if res.keys is not None and len(rec["keys"]) < _KEYS_KEPT:
                    rec["keys"].append(res.keys)  # on the device until exit
                if res.upd is not None:
                    _keep_update(rec, res.upd)
                return res.out
        except Exception as e:
            core.record_error("jit call", e)
            if type(res) is Aux:
                return res.out
        return res

    def __get__(self, obj, objtype=None):
        return self if obj is None else functools.partial(self, obj)

    def _plain_fn(self):
        if self._plain is None:
            self._plain = self._original(self._fun, **self._kwargs)
        return self._plain

    def lower(self, *a, **k):  # ahead-of-time use: the stages of the traced function, followed to their calls
        return _Stage(self, self._jitted.lower(*a, **k))

    def trace(self, *a, **k):
        return _Stage(self, self._jitted.trace(*a, **k))

    def eval_shape(self, *a, **k):
        return self._plain_fn().eval_shape(*a, **k)

    def __getattr__(self, name):
        if name.startswith("__") or name in ("_jitted", "_plain", "_original", "_fun", "_kwargs", "_rec"):
            raise AttributeError(name)
        return getattr(self._jitted, name)


class _Stage:
    """A stage of ahead-of-time use of a Traced function (`jit(f).trace(...)`, `.lower(...)`, `.compile()`): the
    real stage of the traced function (the program's own graph plus the probe's outputs, as a plain call compiles
    it), whose executable, called, counts as a call of the jitted function: a training step ticks the step clock
    and gives its gradient norms. A program that compiles its step before the loop and calls the executable is
    measured as one that calls the jitted function. Every other attribute is the stage's own."""

    def __init__(self, owner: Traced, stage) -> None:
        self._owner, self._stage = owner, stage

    def lower(self, *a, **k):
        return _Stage(self._owner, self._stage.lower(*a, **k))

    def compile(self, *a, **k):
        return _Stage(self._owner, self._stage.compile(*a, **k))

    def __call__(self, *args, **kwargs):
        return self._owner._call(self._stage, args, kwargs)

    def __getattr__(self, name):
        if name in ("_owner", "_stage"):
            raise AttributeError(name)
        return getattr(self._stage, name)


def _note_data_dtypes(rec: dict, box: Box, args, kwargs) -> None:
    """The floating dtypes of a training step's data arguments, by trace. An argument is data unless it holds a
    parameter the step differentiates (the model, a train state) or is the optimizer's state (two or more floating
    leaves, each shaped as a parameter: the moments). A batch sent as bfloat16 and upcast inside the step (the TPU
    input-pipeline habit) computes in float32 on rounded data: the upcast is invisible in the matmuls' operands,
    the argument's dtype is not. Read off the tracers: no value."""
    jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]
    params = [x for io in box.grad_io if io is not None for x in jax.tree_util.tree_leaves(io[0])]
    if not params:
        return
    ids = {id(x) for x in params}
    shapes = {tuple(getattr(x, "shape", ())) for x in params}
    _s["param_shapes"] = _s.get("param_shapes", frozenset()) | {s for s in shapes if len(s) >= 2}
    seen = rec.setdefault("data_dtypes", {})
    where = []  # the data arguments' places: positions, then keywords (their values are fingerprinted per call)
    for place, arg in (*enumerate(args), *kwargs.items()):
        leaves = jax.tree_util.tree_leaves(arg)
        if any(id(x) in ids for x in leaves):
            continue
        floats = [x for x in leaves if getattr(x, "dtype", None) is not None and jnp.issubdtype(x.dtype, jnp.floating)]
        if len(floats) >= 2 and all(tuple(x.shape) in shapes for x in floats):
            continue
        where.append(place)
        for x in floats:
            d = str(x.dtype)
            seen[d] = seen.get(d, 0) + 1
    rec["data_args"] = where


def _note_batch(rec: dict, args, kwargs) -> None:
    """A training step's data arguments, fingerprinted (batches.py) from host memory: numpy arrays, JAX arrays on the
    CPU backend, or arrays the probe saw `jax.device_put` copy from the host. Nothing is read from an accelerator."""
    where = rec.get("data_args")
    if not where:
        return
    jax = sys.modules["jax"]
    data = []
    for place in where:
        if isinstance(place, int) and place >= len(args):
            continue
        arg = args[place] if isinstance(place, int) else kwargs.get(place)
        data += [x for x in jax.tree_util.tree_leaves(arg)
                 if int(getattr(x, "size", 0) or 0) >= batches.MIN_SIZE and not _is_key(jax, x)]
    batches.note_shapes(data, rec["name"], core.clock.step)
    moments = batches.wants_moments("train")
    if batches.full() and not moments:
        return
    devices = _s.get("local_devices")
    if devices is None:
        devices = _s["local_devices"] = int(jax.local_device_count())
    parts, hosts = _host_parts(data, devices > 1 or moments)
    if moments:
        batches.note_moments(_summed(data, hosts), parts, "train")
    if batches.full():
        return
    batches.note(parts, "jax step", core.clock.step)  # ticked before the call
    if devices > 1 and hosts and all(h is not None for h in hosts):  # all in host memory: split as the devices get it
        batches.note_chunks(hosts, devices, core.clock.step)


def _host_parts(data: list, want_host: bool) -> tuple[list, list]:
    """Each value's hashed bytes (None where it is not in host memory) and, where read, its host array."""
    parts, hosts = [], []
    for x in data:
        part, host = batches.copied_part(x), None
        if type(x).__module__.startswith("numpy"):
            host = x
        elif (part is None or want_host) and all(getattr(d, "platform", "") == "cpu" for d in _devices(x)) \
                and not x.is_deleted():  # read only where the fingerprint or the device slices need it
            import numpy as np

            with core.quiet():
                host = np.asarray(x)  # the CPU backend: host memory already, nothing moves
        if part is None and host is not None:
            part = batches.numpy_part(host)
        parts.append(part)
        hosts.append(host)
    return parts, hosts


def _summed(data: list, hosts: list) -> list:
    """What batches.note_moments sums of each value: its host array, or the sums taken when it was copied to the
    device from the host (an accelerator's value is not read back)."""
    return [h if h is not None else batches.copied_sums(x) for x, h in zip(data, hosts)]


def _note_after(rec: dict, args, kwargs) -> None:
    """A host call of a function that is not a training step: right after a step, whether it is given that step's
    batch again (batches.note_after), its values hashed as the step's are; and its data as evaluation inputs
    (batches.note_moments), leaving out values shaped as the training step's parameters."""
    checking, moments = batches.checking_after(core.clock.step), batches.wants_moments("eval")
    if not checking and not moments:
        return
    jax = sys.modules["jax"]
    data = [x for x in jax.tree_util.tree_leaves((args, kwargs))
            if int(getattr(x, "size", 0) or 0) >= batches.MIN_SIZE and not _is_key(jax, x)]
    if checking:
        batches.note_after(_host_parts(data, False)[0], core.clock.step)
    if moments:
        jnp, shapes = sys.modules["jax.numpy"], _s.get("param_shapes") or ()
        data = [x for x in data if len(x.shape) >= 2 and tuple(x.shape) not in shapes
                and 2 <= x.size // max(1, x.shape[0]) <= batches.MOMENT_MAX_WIDTH
                and jnp.issubdtype(x.dtype, jnp.floating)]
        if data:
            parts, hosts = _host_parts(data, True)
            batches.note_moments(_summed(data, hosts), parts, "eval", rec["name"], core.clock.step)


def _devices(x) -> set:
    try:
        return set(x.devices())
    except Exception:
        return {None}


def _is_key(jax, x) -> bool:
    try:
        return bool(jax.dtypes.issubdtype(x.dtype, jax.dtypes.prng_key))
    except Exception:
        return False


def _is_step(rec: dict) -> bool:
    """A host call of this function is one training step: it traces the optax update, or, in a program whose
    update no optax transformation makes (SGD written by hand), it takes a gradient."""
    return rec["train"] or bool(rec.get("grad") and not _s.get("update_ever"))


def _wrap_grad(jax, name: str) -> None:
    """jax.grad / jax.value_and_grad: applying the gradient function inside a traced function marks that trace
    (a Python wrapper around the call: the traced computation is the program's own)."""
    orig = getattr(jax, name, None)
    if orig is None or getattr(orig, "_ladder_wrapped", False):
        return

    @functools.wraps(orig)
    def transform(fun, *args, **kwargs):
        g = orig(fun, *args, **kwargs)
        argnums = kwargs.get("argnums", args[0] if args else 0)
        has_aux = bool(kwargs.get("has_aux", args[1] if len(args) > 1 else False))

        @functools.wraps(g)
        def apply(*a, **k):
            box = current_box()
            out = g(*a, **k)
            if box is not None:
                box.grad_seen = True
                try:
                    params = a[argnums] if isinstance(argnums, int) else tuple(a[i] for i in argnums)
                    grads = out[1] if name == "value_and_grad" else (out[0] if has_aux else out)
                    box.grad_io.append((params, grads))
                except Exception:  # parameters passed by keyword: no samples of this update
                    box.grad_io.append(None)
            return out

        return apply

    transform._ladder_wrapped = True
    setattr(jax, name, transform)


def _keep(aux) -> None:
    gn = core.grad_norms
    step = core.clock.step
    if gn.owner is None:
        gn.owner, gn.source, gn.collect = "jax", "optax update (outermost transformation)", _collect
    if gn.owner != "jax" or len(gn.values) >= core.MAX_GRAD_NORMS or not core.kept(step):
        return
    gn.values.append((step, aux))


def _scalar(x) -> float | None:
    if x is None:
        return None
    shape = getattr(x, "shape", ())
    v = x[0] if shape else x  # pmap: one value per device; they agree when the gradients are synchronised
    return float(v)


def _collect(values: list) -> list:
    jax = sys.modules["jax"]
    host = jax.device_get([aux for _, aux in values])
    clip = (core.grad_norms.clip or {}).get("max_norm")
    first = (core.grad_norms.clip or {}).get("first", False)
    zeros = [(step, aux[3]) for (step, _), aux in zip(values, host) if len(aux) > 3 and aux[3] is not None]
    if zeros:  # which gradient leaves were exactly zero (optax_facts: parameters a gradient cut never trains)
        optax_facts = sys.modules.get("_ladder_probe.optax_facts")
        if optax_facts is not None:
            optax_facts.note_zero_gradients(zeros)
    out = []
    for (step, _), aux in zip(values, host):
        g, p = _scalar(aux[0]), _scalar(aux[1]) if len(aux) > 1 else None
        state = _scalar(aux[2]) if len(aux) > 2 else None
        # The outermost transformation sees the gradient before clipping: the optimizer receives the
        # clipped one when a global-norm clip comes first in the chain.
        post = min(g, clip) if clip is not None and first and g is not None and g == g else g
        # columns as torch's ([step, received, params, pre-clip, <g, theta>]), then the state's distance from fresh
        out.append([step, post, p, g, None, state])
    return [[s] + [x if x is None or (x == x and abs(x) != float("inf")) else repr(x) for x in r]
            for s, *r in out]


# ---------------------------------------------------------------- a hand-written update, sampled

# A step whose update no optax transformation makes (SGD or Adam written by hand) is invisible as an optimizer.
# Instead it hands out, beside its output, the first elements of each parameter and gradient leaf that
# jax.grad saw, and the gradient's global norm: consecutive calls give each update (the next call's
# parameters minus this call's), and the check replays the reference's optimizer on those gradients. Kept
# for windows of consecutive calls (the first, from call 32 on at every 1.25x, and the last), on the device
# until exit.
_UPD_ELEMENTS = 16  # elements sampled per leaf
_UPD_LEAVES = 256
_UPD_WINDOW = 6  # consecutive calls: five updates


def _update_io(rec: dict, box: Box):
    """The samples of the one gradient this trace took, as tracers of this trace; None when there is not
    exactly one, or it belongs to a nested transformation."""
    if len(box.grad_io) != 1 or box.grad_io[0] is None or box.trace is None:
        rec["update_io"] = {"why": "not exactly one jax.grad application in the step"
                            if len(box.grad_io) != 1 else "parameters passed to the gradient by keyword"}
        return None
    jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]
    params, grads = box.grad_io[0]
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    gleaves = jax.tree_util.tree_leaves(grads)
    if len(flat) != len(gleaves) or not flat:
        rec["update_io"] = {"why": "the gradient's leaves do not match the parameters'"}
        return None
    if not all(getattr(x, "_trace", None) is box.trace for x in gleaves + [p for _, p in flat]):
        rec["update_io"] = {"why": "the gradient is taken inside a nested transformation (scan, vmap, shard_map), "
                                   "or of parameters that are not the step's arguments"}
        return None
    pairs = [(path, p, g) for (path, p), g in zip(flat, gleaves)
             if getattr(g, "shape", None) == getattr(p, "shape", None) and jnp.issubdtype(g.dtype, jnp.floating)]
    if not pairs:
        rec["update_io"] = {"why": "no floating-point parameter leaf"}
        return None
    rec["update_io"] = {"paths": [jax.tree_util.keystr(path) for path, _, _ in pairs[:5000]],
                        "shapes": [list(p.shape) for _, p, _ in pairs[:5000]], "leaves": len(flat)}
    pairs = pairs[:_UPD_LEAVES]  # the first leaves are sampled; the others are listed
    rec["update_io"]["sizes"] = [min(int(p.size), _UPD_ELEMENTS) for _, p, _ in pairs]

    def heads(xs):  # one output for all leaves' samples, not one per leaf: each output buffer costs every call
        return jnp.concatenate([jnp.ravel(x)[:_UPD_ELEMENTS].astype(jnp.float32) for x in xs])

    sq = sum(jnp.sum(jnp.square(g.astype(jnp.float32))) for g in gleaves if jnp.issubdtype(g.dtype, jnp.floating))
    return heads(p for _, p, _ in pairs), heads(g for _, _, g in pairs), jnp.sqrt(sq)


_UPD_STARTS = frozenset({1} | {round(32 * 1.25 ** j) for j in range(24)})  # 1, 32, 40, 50, ... 5421
_UPD_LATER_LEAVES = 16  # leaves kept in the windows after the first (they check the rate, pooled over leaves)


def _keep_update(rec: dict, upd) -> None:
    n = rec["upd_calls"] = rec.get("upd_calls", 0) + 1
    starts = rec.setdefault("upd_windows", {})  # first call of a window -> [(step, samples), ...]
    start = next(reversed(starts), None)  # windows never overlap: only the newest can still be open
    if start is not None and n >= start + _UPD_WINDOW:
        start = None
    if start is None and n in _UPD_STARTS:
        start = n
        starts[start] = []
    if start is not None:
        starts[start].append((core.clock.step, upd))
    last = rec.setdefault("upd_last", [])
    last.append((core.clock.step, upd))
    if len(last) > _UPD_WINDOW:
        del last[0]


def _update_samples() -> dict | None:
    jax = sys.modules["jax"]
    np = sys.modules.get("numpy")
    for f in _s["functions"]:
        io = f.get("update_io")
        if not f.get("upd_calls") or not io or "paths" not in io:
            continue
        windows = [w for w in f["upd_windows"].values() if len(w) >= 2]
        last = f.get("upd_last") or []
        if last and all(last[0][0] != w[0][0] for w in windows):
            windows.append(last)
        out = []
        pmap = f["name"].startswith("pmap(")
        ends = list(itertools.accumulate(io["sizes"]))
        for w in windows:
            with core.quiet():
                host = jax.device_get([u for _, u in w])
            leaves = len(ends) if w is f["upd_windows"].get(1) else min(len(ends), _UPD_LATER_LEAVES)

            def rows(packed, mean: bool):  # pmap: device 0's parameters, the gradients averaged over devices
                flat = np.ravel((np.mean(packed, axis=0) if mean else packed[0]) if pmap else packed)
                return [[float(v) for v in flat[(ends[i - 1] if i else 0):ends[i]]] for i in range(leaves)]

            out.append({"steps": [s for s, _ in w],
                        "params": [rows(p, False) for p, _, _ in host],
                        "grads": [rows(g, True) for _, g, _ in host],
                        "gnorm": [float(np.ravel(n)[0]) for _, _, n in host]})
        return {"function": f["name"], "paths": io["paths"], "shapes": io["shapes"], "leaves": io["leaves"],
                "elements": _UPD_ELEMENTS, "per_device": pmap, "windows": out}
    why = next((f["update_io"]["why"] for f in _s["functions"] if (f.get("update_io") or {}).get("why")), None)
    return {"why": why} if why else None


def _wrap_transform(jax, attr: str, kind: str) -> None:
    original = getattr(jax, attr, None)
    if original is None or getattr(original, "_ladder_wrapped", False):
        return

    def wrapper(fun=None, /, *args, **kwargs):
        if fun is None:  # the decorator-factory form: jax.jit(static_argnames=...)(f)
            return lambda f: wrapper(f, *args, **kwargs)
        if args:  # a call this probe does not know: leave it alone
            return original(fun, *args, **kwargs)
        try:
            return Traced(original, fun, kwargs, kind)
        except Exception as e:
            core.record_error(f"{attr} wrapper", e)
            return original(fun, **kwargs)

    core.replace(jax, attr, wrapper, original)


def _wrap_pmap(jax) -> None:
    original = getattr(jax, "pmap", None)
    if original is None or getattr(original, "_ladder_wrapped", False):
        return

    def pmap(fun=None, axis_name=None, **kwargs):
        if fun is None:
            return lambda f: pmap(f, axis_name, **kwargs)
        try:
            return Traced(original, fun, {"axis_name": axis_name, **kwargs}, "pmap")
        except Exception as e:
            core.record_error("pmap wrapper", e)
            return original(fun, axis_name, **kwargs)

    try:
        functools.update_wrapper(pmap, original)
    except Exception:
        pass
    pmap._ladder_wrapped = True
    jax.pmap = pmap


# ---------------------------------------------------------------- compute precision

# The primitives whose operand dtypes tell the precision a model computes in: a Flax layer built with
# dtype=bfloat16 keeps float32 parameters and an unchanged optimizer, only its matmuls and convolutions run in
# bfloat16. jnp.matmul, `@`, einsum, flax and lax all bind these two.
_COMPUTE_PRIMITIVES = ("dot_general_p", "conv_general_dilated_p")


# Primitives whose output is a view of their input (a transposed, reshaped or cast kernel): an updated parameter
# stays one through them.
_VIEW_PRIMITIVES = ("transpose_p", "reshape_p", "squeeze_p", "broadcast_in_dim_p")


def _hook_compute(jax) -> None:
    for attr in _COMPUTE_PRIMITIVES:
        prim = getattr(jax.lax, attr, None)
        if prim is not None and not getattr(prim.bind, "_ladder_wrapped", False):
            prim.bind = _noting(prim.bind, _operand_dtypes, "compute")  # an instance attribute: the class's stays
    prim = getattr(jax.lax, "convert_element_type_p", None)
    if prim is not None and not getattr(prim.bind, "_ladder_wrapped", False):
        prim.bind = _noting(prim.bind, _half_cast, "view")
    for attr in _VIEW_PRIMITIVES:
        prim = getattr(jax.lax, attr, None)
        if prim is not None and not getattr(prim.bind, "_ladder_wrapped", False):
            prim.bind = _noting(prim.bind, None, "view")
    try:  # a jitted jax.numpy function called in the trace (`@`, jnp.dot, einsum, .T): its jaxpr, followed
        from jax._src import pjit

        prim = getattr(pjit, "jit_p", None) or getattr(pjit, "pjit_p", None)
    except Exception:
        prim = None
    if prim is not None and not getattr(prim.bind, "_ladder_wrapped", False):
        prim.bind = _noting(prim.bind, None, "call")


_COMPUTE_NAMES = frozenset({"dot_general", "conv_general_dilated"})


def _mixes(derived: list) -> bool:
    """A matmul's or convolution's two operands, one derived from an updated parameter and the other not: the new
    weights applied to data (a product of two parameters is not)."""
    return any(derived[:2]) and not all(derived[:2])


def _sub_jaxpr(params: dict):
    for v in params.values():
        j = getattr(v, "jaxpr", v)
        if hasattr(j, "eqns") and hasattr(j, "invars"):
            return j
    return None


def _flow(jaxpr, marked_in: list, depth: int = 0) -> tuple[int, list]:
    """Through a jaxpr whose inputs `marked_in` are updated parameters: the matmuls and convolutions with one operand
    derived from an updated parameter and another not, and which outputs derive from one."""
    marked = {v for v, m in zip(jaxpr.invars, marked_in) if m}

    def derived(v) -> bool:
        try:
            return v in marked
        except TypeError:  # a literal
            return False

    hits = 0
    for eqn in jaxpr.eqns:
        ins = [derived(v) for v in eqn.invars]
        if not any(ins):
            continue
        if eqn.primitive.name in _COMPUTE_NAMES and _mixes(ins):
            hits += 1
        sub = _sub_jaxpr(eqn.params)
        if sub is not None and len(sub.invars) == len(eqn.invars) and depth < 8:
            n, outs = _flow(sub, ins, depth + 1)
            hits += n
            marked.update(v for v, m in zip(eqn.outvars, outs) if m)
        else:
            if sub is not None and any(e.primitive.name in _COMPUTE_NAMES for e in sub.eqns):
                hits += 1  # a loop or branch over the updated parameters that computes with them
            marked.update(eqn.outvars)
    return hits, [derived(v) for v in jaxpr.outvars]


_HALF = ("bfloat16", "float16")


def _operand_dtypes(args, params) -> list[str]:
    return [str(getattr(x, "dtype", "?")) for x in args[:2]]


def _half_cast(args, params) -> list[str]:
    """A float32 value cast down to a half dtype (`logits.astype(jnp.bfloat16)` before the loss), as
    "cast:<dtype>"; casts of integers and Python constants (a scalar multiplying a bfloat16 array) are not a
    lowering."""
    to, src = str(params.get("new_dtype")), str(getattr(args[0], "dtype", "")) if args else ""
    return [f"cast:{to}"] if to in _HALF and src.startswith("float") and src not in _HALF else []


def _noting(orig, keys, role: str):
    """`orig` (a primitive's bind), counting `keys(args, params)` in the current trace's box: traced inside a
    wrapped function, a tracer's dtype is known without a device read. After optax.apply_updates in the trace, a
    "view" primitive of an updated parameter gives one, and a "compute" primitive with one operand updated and
    another not (the model applied to the batch with the new weights) is counted."""
    def bind(*args, **params):
        box = current_box()
        if box is not None and keys is not None:
            try:
                for d in keys(args, params):
                    box.compute[d] = box.compute.get(d, 0) + 1
            except Exception as e:
                core.record_error("jax compute dtypes", e)
        out = orig(*args, **params)
        if box is not None and box.updated:
            try:
                hit = [box.updated.get(id(a)) is a for a in args]
                if role == "view" and hit and hit[0]:
                    box.updated[id(out)] = out
                elif role == "compute" and _mixes(hit):
                    box.after_matmuls += 1
                elif role == "call" and any(hit) and "jaxpr" in params:
                    n, outs = _flow(params["jaxpr"].jaxpr, hit)
                    box.after_matmuls += n
                    for o, m in zip(out, outs):
                        if m:
                            box.updated[id(o)] = o
            except Exception as e:
                core.record_error("jax updated parameters", e)
        return out

    bind._ladder_wrapped = True
    return bind


def _merge_compute(rec: dict, box: Box, stack: list) -> None:
    """A function's operand dtypes over its traces; a function traced inside another's trace adds its own to
    the enclosing one (a jitted model called by the jitted training step)."""
    seen = rec.setdefault("compute", {})
    for d, n in box.compute.items():
        seen[d] = seen.get(d, 0) + n
        if stack:
            outer = stack[-1].compute
            outer[d] = outer.get(d, 0) + n


# ---------------------------------------------------------------- dropout layers (Flax)

_MAX_DROPOUT_CALLS = 256  # layer calls noted per trace


def _merge_dropout(rec: dict, box: Box, stack: list) -> None:
    """The dropout rates a function's traces applied ("on") and those its layers were called with but did not apply
    ("off": `deterministic=True`, a `train=False` default), and whether a layer had rate 0; a function traced inside
    another's trace adds its own to the enclosing one (the model's jitted forward called by the jitted step)."""
    d = rec.setdefault("dropout", {"on": [], "off": [], "zero_rate": False})
    for rate, on in box.dropout:
        if rate == 0:
            d["zero_rate"] = True
            continue
        side = d["on" if on else "off"]
        if rate not in side:
            side.append(rate)
            side.sort()
    if stack and len(stack[-1].dropout) < _MAX_DROPOUT_CALLS:
        stack[-1].dropout.extend(box.dropout[:_MAX_DROPOUT_CALLS - len(stack[-1].dropout)])


def _wrap_dropout(cls) -> None:
    """A Flax dropout layer (linen's or nnx's `Dropout`): each call inside a traced function notes its rate and
    whether it applied a mask. Both return their input itself when they do not (`deterministic`, or a rate of 0), so
    the layer's own decision is read from its output, whatever flag or default made it. The call is the layer's."""
    orig = cls.__dict__.get("__call__") if isinstance(cls, type) else None
    if orig is None or getattr(orig, "_ladder_wrapped", False):
        return

    def __call__(self, *args, **kwargs):
        out = orig(self, *args, **kwargs)
        box = current_box()
        if box is not None and len(box.dropout) < _MAX_DROPOUT_CALLS:
            try:
                rate = getattr(self, "rate", None)
                if isinstance(rate, (int, float)) and not isinstance(rate, bool) and rate >= 0:
                    x = args[0] if args else kwargs.get("inputs")
                    box.dropout.append((round(float(rate), 6), out is not x))
            except Exception as e:
                core.record_error("flax dropout", e)
        return out

    core.replace(cls, "__call__", __call__, orig)


def on_flax_linen(linen) -> None:
    _wrap_dropout(getattr(linen, "Dropout", None))


def on_flax_nnx(nnx) -> None:
    _wrap_dropout(getattr(nnx, "Dropout", None))


# ---------------------------------------------------------------- random draws

# jax.random functions that consume a key. The same key gives the same numbers: JAX's contract is that a key
# is used once, and a port that passes the step the same key each call (or shuffles each epoch with the
# same key) repeats its dropout masks or its data order where the reference draws anew.
_DRAWS = ("bernoulli", "normal", "uniform", "randint", "permutation", "choice", "categorical", "truncated_normal",
          "gumbel", "exponential", "laplace", "logistic", "rademacher", "bits", "shuffle")


def _hook_random(jax) -> None:
    mod = getattr(jax, "random", None)
    for name in _DRAWS:
        orig = getattr(mod, name, None)
        if callable(orig) and not getattr(orig, "_ladder_wrapped", False):
            setattr(mod, name, _drawing(jax, name, orig))


def _drawing(jax, name: str, orig):
    def draw(*args, **kwargs):
        try:
            _note_draw(jax, name, args[0] if args else kwargs.get("key"))
        except Exception as e:
            core.record_error("random draw", e)
        return orig(*args, **kwargs)

    functools.update_wrapper(draw, orig)
    draw._ladder_wrapped = True
    return draw


def _key_data(jax, key):
    try:
        if jax.dtypes.issubdtype(key.dtype, jax.dtypes.prng_key):
            return jax.random.key_data(key)
    except Exception:
        pass
    return key


def _note_draw(jax, name: str, key) -> None:
    """A draw inside a traced function is noted with its key (a tracer of that trace, or a constant) to hand
    out as an output of the step; a draw on the host during training is fingerprinted where it is made."""
    if key is None:
        return
    box = current_box()
    tracer = isinstance(key, jax.core.Tracer)
    if box is not None:
        mine = box.trace is not None and getattr(key, "_trace", None) is box.trace
        if (mine or not tracer) and len(box.draws) < _MAX_STEP_DRAWS:
            box.draws.append((name, _key_data(jax, key)))
        return
    if tracer or core.clock.eval:  # an evaluation draws as the program likes (a fixed subset each time)
        return
    if _initialising():
        # a model initialised again (the template a checkpoint is restored into) draws its initial weights
        # from the same key: values the restore overwrites, or a reset the curves show
        _s["init_draws"] = _s.get("init_draws", 0) + 1
        return
    site = _site()
    sites = _s["host_draws"]
    rec = sites.get(site)
    if rec is None:
        if len(sites) >= _MAX_HOST_SITES:
            return
        rec = sites[site] = {"site": site, "draw": name, "calls": 0, "steps": {}, "reused": 0, "first_reuse": None}
    with core.quiet():
        fp = jax.device_get(_key_data(jax, key)).tobytes()
    rec["calls"] += 1
    step = core.clock.step
    seen = rec["steps"].get(fp)
    if seen is None:
        if len(rec["steps"]) < 256:
            rec["steps"][fp] = step
    elif seen != step:  # the same key at another training step (one key for two aligned arrays is one step)
        rec["reused"] += 1
        if rec["first_reuse"] is None:
            rec["first_reuse"] = [seen, step]


# (library folder, function): a model's initialisation, whose draws are the initial weights
_INIT_FRAMES = (("/flax/", "init"), ("/flax/", "init_with_output"), ("/flax/", "lazy_init"), ("/flax/nnx/", "__init__"),
                ("/haiku/", "init_fn"), ("/equinox/", "__init__"))


def _initialising() -> bool:
    f = sys._getframe(3)
    for _ in range(80):
        if f is None:
            return False
        code = f.f_code
        if any(lib in code.co_filename and code.co_name == fn for lib, fn in _INIT_FRAMES):
            return True
        f = f.f_back
    return False


def _site() -> str:
    f = sys._getframe(3)
    for _ in range(30):
        if f is None:
            break
        name = f.f_code.co_filename
        if not any(part in name for part in ("/jax/", "/flax/", "/optax/", "_ladder_probe")):
            return f"{name.rsplit('/', 1)[-1]}:{f.f_lineno}"
        f = f.f_back
    return "?"


def _random_facts() -> dict | None:
    jax = sys.modules["jax"]
    step_draws = []
    for f in _s["functions"]:
        kept = f.get("keys") or []
        if not kept:
            continue
        with core.quiet():
            host = jax.device_get(kept)
        n = min(len(k) for k in host)
        for i in range(n):
            distinct = len({k[i].tobytes() for k in host})
            step_draws.append({"function": f["name"], "draw": (f.get("draws") or ["?"] * n)[i], "calls": len(host),
                               "distinct": distinct})
    host_draws = [{"site": r["site"], "draw": r["draw"], "calls": r["calls"], "keys": len(r["steps"]),
                   "reused": r["reused"], "first_reuse": r["first_reuse"]} for r in _s["host_draws"].values()]
    if not step_draws and not host_draws:
        return None
    return {"step_draws": step_draws, "host_draws": host_draws, "kept_calls": _KEYS_KEPT,
            "init_draws": _s.get("init_draws", 0)}


# ---------------------------------------------------------------- host reads

def _hook_host_reads(jax) -> bool:
    arr = sys.modules.get("jax._src.array")
    cls = getattr(arr, "ArrayImpl", None)
    prop = getattr(cls, "_value", None) if cls is not None else None
    if not (isinstance(prop, property) and prop.fget is not None):
        return False
    fget = prop.fget
    count = core.reads.count

    def _value(self):
        # _npy_value is None until the array has been read back: this read is a host transfer
        if getattr(self, "_npy_value", 1) is None:
            count("jax.Array read")
        return fget(self)

    cls._value = property(_value, doc=prop.__doc__)
    # .item() and .tolist() go through numpy, which on the CPU backend reads the buffer directly without _value;
    # so do np.asarray(x) and np.array(x), through the C buffer protocol, with no Python call on jax's side.
    # Counted where they are called. Code that bound `from numpy import asarray` before the probe installed
    # keeps the original, uncounted.
    for name in ("item", "tolist"):
        orig = getattr(cls, name, None)
        if orig is not None and not getattr(orig, "_ladder_wrapped", False):
            setattr(cls, name, _counting_read(orig, cls, count))
    numpy = sys.modules.get("numpy")
    for name in ("asarray", "array"):
        orig = getattr(numpy, name, None)
        if orig is not None and not getattr(orig, "_ladder_wrapped", False):
            setattr(numpy, name, _counting_read(orig, cls, count))
    return True


def _counting_read(orig, cls, count):
    """`orig`, counting a host read when its first argument is a jax.Array never read before (quietly inside,
    so that an accelerator's _value read under it is not counted twice)."""

    def fn(a, *args, **kwargs):
        if type(a) is cls and getattr(a, "_npy_value", 1) is None:
            count("jax.Array read")
            with core.quiet():
                return orig(a, *args, **kwargs)
        return orig(a, *args, **kwargs)

    functools.update_wrapper(fn, orig)
    fn._ladder_wrapped = True
    return fn


def _hook_callbacks(jax) -> None:
    """A host callback inside a compiled step (jax.debug.callback, jax.debug.print) is a host round-trip
    each time the step runs: each run is counted as a read."""
    dbg = sys.modules.get("jax._src.debugging")
    original = getattr(dbg, "debug_callback", None) if dbg is not None else None
    if original is None or getattr(original, "_ladder_wrapped", False):
        return
    count = core.reads.count

    def debug_callback(callback, *args, **kwargs):
        def counted(*a, **k):
            count("host callback")
            return callback(*a, **k)

        return original(counted, *args, **kwargs)

    functools.update_wrapper(debug_callback, original)
    debug_callback._ladder_wrapped = True
    dbg.debug_callback = debug_callback
    if getattr(jax.debug, "callback", None) is original:
        jax.debug.callback = debug_callback


# ---------------------------------------------------------------- compiles and the backend

def _duration_listener(event, duration, **kw):
    try:
        if event == "/jax/core/compile/backend_compile_duration" and not core.is_quiet():  # not the probe's own
            core.append(_s["compiles"], {"t": time.time(), "function": str(kw.get("fun_name", "?")),
                                         "duration_s": float(duration), "step": core.clock.step,
                                         "eval": core.clock.eval})
            if _s["backend"] is None:
                _snapshot_backend()
    except Exception as e:
        core.record_error("jax listener", e)


def _event_listener(event, **kw):
    try:
        if event == "/jax/compilation_cache/cache_hits":
            core.append(_s["cache_hits"], {"t": time.time()})
    except Exception as e:
        core.record_error("jax listener", e)


def _snapshot_backend() -> None:
    jax = sys.modules.get("jax")
    xb = sys.modules.get("jax._src.xla_bridge")
    if jax is None or xb is None or not getattr(xb, "_backends", None):
        return  # the user never started a backend; asking would start one
    _s["backend"] = jax.default_backend()
    devs = jax.devices()
    _s["platforms"] = sorted({d.platform for d in devs})
    _s["device_count"] = len(devs)


def on_jax(jax) -> None:
    import atexit

    core.framework("jax", str(getattr(jax, "__version__", "?")))
    mon = jax.monitoring
    mon.register_event_duration_secs_listener(_duration_listener)
    mon.register_event_listener(_event_listener)
    _s["host_reads_hooked"] = _hook_host_reads(jax)
    _register_aux(jax)
    _wrap_transform(jax, "jit", "jit")
    _wrap_pmap(jax)
    _wrap_device_put(jax)
    for name in ("grad", "value_and_grad"):
        _wrap_grad(jax, name)
    try:
        _hook_random(jax)
    except Exception as e:
        core.record_error("jax random", e)
    try:
        _hook_compute(jax)
    except Exception as e:
        core.record_error("jax compute dtypes", e)
    try:
        _hook_callbacks(jax)
    except Exception as e:
        core.record_error("jax callbacks", e)
    atexit.register(core.finalise)


HOOKS = {"jax": on_jax, "flax.linen": on_flax_linen, "flax.nnx": on_flax_nnx}


def _wrap_device_put(jax) -> None:
    """`jax.device_put` of host data (numpy leaves): each device array is remembered with its source's fingerprint
    (batches.py), so a batch prefetched to an accelerator is known when a training step takes it."""
    orig = getattr(jax, "device_put", None)
    if orig is None or getattr(orig, "_ladder_wrapped", False):
        return

    def device_put(x, *args, **kwargs):
        out = orig(x, *args, **kwargs)
        if batches.full() and not batches.wants_moments():
            return out
        try:
            src, dst = jax.tree_util.tree_leaves(x), jax.tree_util.tree_leaves(out)
            if len(src) == len(dst):
                for a, b in zip(src, dst):
                    if type(a).__module__.startswith("numpy") and b is not a:
                        batches.remember_copy(b, batches.numpy_part(a))
                        if getattr(a, "ndim", 0) >= 2 and a.dtype.kind == "f":
                            batches.remember_host(b, a)
        except Exception as e:  # never into the program
            core.record_error("jax transfer fingerprint", e)
        return out

    core.replace(jax, "device_put", device_put, orig)


def snapshot() -> dict:
    if "jax" not in core.report["frameworks"]:
        return {}
    try:
        _snapshot_backend()
    except Exception as e:
        core.record_error("jax backend", e)
    try:
        random = _random_facts()
    except Exception as e:
        random = None
        core.record_error("jax random draws", e)
    try:
        samples = _update_samples()
    except Exception as e:
        samples = None
        core.record_error("jax update samples", e)
    functions = [{**{k: v for k, v in f.items() if k not in ("by_step", "keys", "upd_windows", "upd_last",
                                                                                "update_io")},
                  "by_step": [[s, c, r] for s, (c, r) in sorted(f["by_step"].items())]}
                 for f in _s["functions"] if f["calls"] or f["traces"]]
    return {"jax": {"backend": _s["backend"], "platforms": _s["platforms"], "device_count": _s["device_count"],
                    "compiles": _s["compiles"], "cache_hits": _s["cache_hits"],
                    "host_reads_hooked": _s["host_reads_hooked"], "functions": functions, "random": random},
            "update_samples": samples}
