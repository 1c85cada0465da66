"""The probe's core: options, the per-process report, the training-step clock, host-read accounting,
post-import hooks and the report written at exit.

Owns: what every framework module shares. Each stack's facts live in its own module (`torch_facts`,
`xla_facts`, `jax_facts`, `optax_facts`, `seed`, `batches`), behind one small interface:
    HOOKS: {module name: function(module)}   run once the user's program has imported that module
    reset(): None                            start from nothing (at install, and in a forked child)
    snapshot(): dict                         its section of the report, read once at exit
Must not: import any framework the user's program does not import itself, raise into the user's
program, print anything, change an exit code, or change what the program computes (its graphs,
its compile counts, its outputs). Every probe error goes to the report's `errors`.
Standard library only: it runs inside the environment under test, which has no ladder installed.
Timestamps are epoch seconds (time.time()), the clock of the runner's log lines.
"""

from __future__ import annotations

import atexit
import functools
import math
import os
import sys
import threading
import time

SCHEMA = 2
MAX_EVENTS = 2000  # per list: a run that recompiles every step must not grow the report without bound
MAX_ERRORS = 50
MAX_BUCKETS = 20000  # host-read buckets (steps with reads) kept per process
MAX_LR_CHANGES = 20000  # learning-rate changes kept per optimizer (a per-step schedule: one per step)

opts: dict = {}
report: dict = {}
_installed = False
_finalised = False
_modules: list = []  # the framework modules, in the order their snapshots are taken


# ---------------------------------------------------------------- errors

def record_error(where: str, exc: BaseException) -> None:
    try:
        import traceback

        errs = report.setdefault("errors", [])
        if len(errs) < MAX_ERRORS:
            tb = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            loc = f" at {tb[0].filename}:{tb[0].lineno}" if tb else ""
            errs.append(f"{where}: {type(exc).__name__}: {exc}{loc}")
    except Exception:
        pass


def guard(where: str):
    """Decorator: a probe function that records its exception instead of raising it."""

    def deco(fn):
        def wrapped(*a, **kw):
            try:
                return fn(*a, **kw)
            except Exception as e:
                record_error(where, e)
                return None

        wrapped.__name__ = getattr(fn, "__name__", where)
        return wrapped

    return deco


def replace(owner, attr: str, new, original) -> None:
    """Put the probe's `new` in place of `owner.attr` (`original`), with the original's name, docstring and
    signature, marked so that it is never wrapped twice."""
    try:
        functools.update_wrapper(new, original)
    except Exception:
        pass
    new._ladder_wrapped = True
    setattr(owner, attr, new)


def append(lst: list, item, cap: int = MAX_EVENTS) -> None:
    if len(lst) < cap:
        lst.append(item)


def jsonable(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return [jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): jsonable(x) for k, x in v.items()}
    try:  # a 0-d tensor (a tensor learning rate, a capturable step)
        if hasattr(v, "numel") and v.numel() == 1:
            with quiet():
                return float(v.item())
    except Exception:
        pass
    return repr(v)[:200]


def kept(step: int) -> bool:
    """Which steps a per-step series keeps: all of the first 2000, then every 10th, then every 100th."""
    return step <= 2000 or (step <= 20000 and step % 10 == 0) or step % 100 == 0


# ---------------------------------------------------------------- the probe's own reads

_tls = threading.local()


class quiet:
    """While the probe reads values back itself, those reads are not the program's."""

    def __enter__(self):
        _tls.quiet = getattr(_tls, "quiet", 0) + 1

    def __exit__(self, *exc):
        _tls.quiet -= 1


def is_quiet() -> bool:
    return getattr(_tls, "quiet", 0) > 0


# ---------------------------------------------------------------- the training-step clock

class Clock:
    """Training steps begun in this process, as the framework modules see them (torch: optimizer.step, or
    a backward pass when no optimizer ever steps; JAX: calls of the jitted function that holds the
    optimizer update; optax: an eager update), and
    the evaluation windows (torch: a module switched to eval mode)."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.step = 0
        self.source = None
        self.times: list = []
        self.in_step = 0  # inside optimizer.step: reads there are the framework's, not the program's
        self.eval = False

    # Sources that count steps only while nothing better does: a torch program whose update is written
    # by hand (torch.func, no optimizer.step) steps once per backward pass. The first optimizer step takes
    # the clock over and counts from 1 again (gradient accumulation runs several backward passes a step).
    FALLBACK = frozenset({"torch backward"})

    def tick(self, source: str) -> int:
        if self.source is None:
            self.source = source
        elif source != self.source:
            if self.source not in self.FALLBACK or source in self.FALLBACK:
                return self.step  # one clock per process: the first framework that stepped owns it
            self.source, self.step, self.times = source, 0, []
            reads.renumber_from_zero()
        self.step += 1
        if kept(self.step):
            self.times.append([self.step, time.time()])
        return self.step

    def snapshot(self) -> dict:
        return {"steps": self.step, "source": self.source, "step_times": self.times}


clock = Clock()


# ---------------------------------------------------------------- host reads

class HostReads:
    """Reads of device values into Python (`.item()`, `.tolist()`, `.cpu()`, `.numpy()`, `float()` of a
    tensor, a jax.Array read to host, a host callback run from inside a compiled step), bucketed by the
    training step they happened in and by whether an evaluation window was open. Counted the same way
    on every platform, so a CPU reference and an accelerator port compare."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.total = 0
        self.internal = 0  # inside optimizer.step (e.g. torch's Adam reads its step count)
        self.data = 0  # input preparation: inside a data loader's next batch, or a CPU tensor used as an index
        self.ops: dict = {}
        self.by_step: dict = {}  # step -> [reads outside evaluation, reads inside]
        # the same buckets for reads of values already in host memory (a CPU tensor): on a CPU reference they
        # stand for what a device would read; on a port computing on an accelerator they move nothing
        self.host_by_step: dict = {}
        self.overflow = [0, 0]

    def count(self, op: str, data: bool = False, host: bool = False) -> None:
        """One read; `data` marks input preparation wherever it happens (a CPU tensor used as an index); `host`,
        a read of a value in host memory (counted as any other, and apart)."""
        if is_quiet():
            return
        if clock.in_step:
            self.internal += 1
            return
        if data or getattr(_loading, "depth", 0):
            self.data += 1
            return
        self.total += 1
        self.ops[op] = self.ops.get(op, 0) + 1
        if not _bump(self.by_step):
            self.overflow[1 if clock.eval else 0] += 1
        if host:
            _bump(self.host_by_step)

    def renumber_from_zero(self) -> None:
        """The clock was taken over and counts from 0 again: what came before its first step is step 0's."""
        self.by_step, self.host_by_step = _collapsed(self.by_step), _collapsed(self.host_by_step)

    def snapshot(self) -> dict:
        return {"total": self.total, "internal": self.internal, "data": self.data, "ops": self.ops,
                "overflow": self.overflow,
                "by_step": [[s, a, b] for s, (a, b) in sorted(self.by_step.items())],
                "host_by_step": [[s, a, b] for s, (a, b) in sorted(self.host_by_step.items())]}


def _bump(buckets: dict) -> bool:
    """One read in the current step's bucket (outside or inside evaluation); False when the buckets are full."""
    b = buckets.get(clock.step)
    if b is None:
        if len(buckets) >= MAX_BUCKETS:
            return False
        b = buckets[clock.step] = [0, 0]
    b[1 if clock.eval else 0] += 1
    return True


def _collapsed(buckets: dict) -> dict:
    """Every bucket summed into step 0's."""
    zero = [sum(b[0] for b in buckets.values()), sum(b[1] for b in buckets.values())]
    return {0: zero} if any(zero) else {}


reads = HostReads()
_loading = threading.local()  # depth of data-loader calls on this thread (a loader thread has its own)


class loading:
    """Reads inside a data loader's next batch are input preparation, not results read back from the
    device: counted apart (`data`), never in the per-step rate."""

    def __enter__(self) -> None:
        _loading.depth = getattr(_loading, "depth", 0) + 1

    def __exit__(self, *exc) -> None:
        _loading.depth -= 1


class GradNorms:
    """One series per process: the global L2 norms of the gradient the optimizer is handed and of the
    parameters, from the first optimizer that records them. Values stay on the device until exit (no host
    round-trip during training); `collect` (set by the recording module) reads them back once."""

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.owner = None
        self.source = None
        self.values: list = []  # (step, payload): the payload is the recording module's
        self.collect = None  # function(values) -> [[step, grad norm, param norm, pre-clip norm | None, <g, theta> | None], ...]
        self.clip = None  # {"max_norm": x} when the program clips by global norm
        self.every = 1
        self.why_missing = None
        self.clip_seen = None  # function() -> {"max_pre_clip": x, "calls": n}: the clip's largest input, every step

    def snapshot(self) -> dict | None:
        if not self.values or self.collect is None:
            return {"source": self.source, "values": [], "why_missing": self.why_missing} if self.why_missing else None
        with quiet():
            rows = self.collect(self.values)
            seen = self.clip_seen() if self.clip_seen is not None else None
        out = {"source": self.source, "values": rows, "clip": self.clip, "every": self.every}
        if seen:
            out["clip_seen"] = seen
        return out


grad_norms = GradNorms()
MAX_GRAD_NORMS = 5000
NO_GRAD_STEPS = 6  # the optimizer's first updates at which parameters without a gradient are noted (torch, optax)


def optimizer_record(rec: dict) -> dict:
    """Add an optimizer seen by a framework module to the report (torch and optax records share it)."""
    append(report["optimizers"], rec, 50)
    return rec


# ---------------------------------------------------------------- post-import hooks

class _PostImportFinder:
    """First in sys.meta_path: finds a watched module through the other finders, then wraps its
    loader's exec_module so the hook runs once the real module has been executed."""

    def __init__(self, hooks: dict) -> None:
        self.hooks = hooks
        self._busy: set = set()

    def find_spec(self, fullname, path=None, target=None):
        if fullname not in self.hooks or fullname in self._busy:
            return None
        self._busy.add(fullname)
        try:
            spec = None
            for finder in sys.meta_path:
                if finder is self or not hasattr(finder, "find_spec"):
                    continue
                spec = finder.find_spec(fullname, path, target)
                if spec is not None:
                    break
            if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
                return spec
            _wrap_loader(spec.loader, fullname, self.hooks[fullname])
            return spec
        except Exception as e:
            record_error(f"finder {fullname}", e)
            return None
        finally:
            self._busy.discard(fullname)

    def invalidate_caches(self) -> None:
        pass


def _wrap_loader(loader, fullname: str, hooks: list) -> None:
    original = loader.exec_module

    def exec_module(module):
        original(module)  # the user's import error, if any, propagates unchanged
        for hook in hooks:
            try:
                hook(module)
            except Exception as e:
                record_error(f"hook {fullname}", e)

    loader.exec_module = exec_module  # instance attribute: this loader serves only this module


def framework(name: str, version: str) -> None:
    report["frameworks"][name] = version


# ---------------------------------------------------------------- exit

def finalise() -> None:
    """Reads every module's facts once, before the frameworks' own exit handlers clear them. The
    frameworks register their exit handlers while importing; modules register this after that, so it
    runs first (atexit is LIFO)."""
    global _finalised
    if _finalised:  # atexit handlers run one at a time: a flag is enough
        return
    _finalised = True
    # counters first, then anything that reads values back (that would move the counters)
    for mod in sorted(_modules, key=lambda m: getattr(m, "SNAPSHOT_ORDER", 0)):
        try:
            section = mod.snapshot()
            if section:
                report.update(section)
        except Exception as e:
            record_error(f"{mod.__name__} snapshot", e)
    report["clock"] = clock.snapshot()
    report["host_reads"] = reads.snapshot()
    try:
        report["grad_norms"] = grad_norms.snapshot()
    except Exception as e:
        record_error("gradient norms", e)


def _write_report() -> None:
    out = os.environ.get("LADDER_PROBE_DIR")
    if not out:
        return
    try:
        import json

        t0 = time.perf_counter()
        finalise()
        report["ended_at"] = time.time()
        json.dumps(report, default=repr)  # encoded twice so the report can say what writing it cost
        report["exit_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"probe-{os.getpid()}.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(report, f, default=repr)
        os.replace(tmp, path)
    except Exception as e:  # nowhere left to record it; the user's exit must not change
        try:
            with open(os.path.join(out, f"probe-{os.getpid()}.error"), "w") as f:
                f.write(f"{type(e).__name__}: {e}\n")
        except Exception:
            pass


def _reset() -> None:
    global _finalised
    frameworks = dict(report.get("frameworks", {}))
    report.clear()
    report.update({"schema": SCHEMA, "pid": os.getpid(), "ppid": os.getppid(), "argv": list(sys.argv)[:20],
                   "started_at": time.time(), "ended_at": None, "options": dict(opts),
                   "frameworks": frameworks, "errors": [], "optimizers": []})
    clock.reset()
    reads.reset()
    grad_norms.reset()
    _finalised = False
    for mod in _modules:
        try:
            mod.reset()
        except Exception as e:
            record_error(f"{mod.__name__} reset", e)


_inherited: list = []  # in a forked child: what the parent's probe held, kept referenced, never freed here


def _held(x, depth: int = 0):
    """x's containers copied (4 levels), their contents the same objects: holds every value a reset drops."""
    if depth > 4:
        return x
    if isinstance(x, dict):
        return {k: _held(v, depth + 1) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and not hasattr(x, "_fields"):
        return [_held(v, depth + 1) for v in x]
    return x


def _after_fork_in_child() -> None:
    """A forked child (multiprocessing 'fork', a DataLoader worker) inherits the parent's state: start its own
    report. What the parent held stays referenced in the child, never freed: it includes device tensors (gradient
    norms and update samples kept on the device until exit), and freeing one runs its framework's destructor, which
    takes locks another thread of the parent may have held at the fork (torch_xla's graph executor: a DataLoader
    worker forked mid-training deadlocked on its first statement, round 16's regress/xla_worker_shards)."""
    try:
        _inherited.append([_held(report), _held(vars(grad_norms)), _held(vars(clock)), _held(vars(reads))]
                          + [_held({k: v for k, v in vars(m).items() if isinstance(v, (dict, list))})
                             for m in _modules])
    except Exception as e:
        record_error("after fork", e)
    _reset()


class _Anchor:
    """multiprocessing.util.register_after_fork keeps a weak reference to an object: this one."""


_anchor = _Anchor()


def _on_mp_util(util) -> None:
    # multiprocessing ends a forked child with os._exit, which skips atexit, and clears the
    # finalizers it inherited; the after-fork callbacks run after that clearing, so register there.
    util.register_after_fork(_anchor, lambda _obj: util.Finalize(None, _write_report, exitpriority=-1000))


def configure(**options) -> None:
    """Replace the options and start the report anew: for tests and benchmarks that call the probe's hooks
    directly in one process (a run gets its options from LADDER_PROBE_OPTS at start-up)."""
    opts.clear()
    opts.update(options)
    _reset()


def _read_options() -> dict:
    raw = os.environ.get("LADDER_PROBE_OPTS")
    if not raw:
        return {}
    import json

    try:
        out = json.loads(raw)
    except ValueError:
        return {}
    return out if isinstance(out, dict) else {}


def install() -> None:
    """Called by sitecustomize at start-up. Idempotent."""
    global _installed
    if _installed:
        return
    _installed = True
    t0 = time.perf_counter()
    opts.clear()
    opts.update(_read_options())
    from _ladder_probe import batches, integrity, jax_facts, optax_facts, seed, torch_facts, xla_facts

    _modules[:] = [torch_facts, xla_facts, jax_facts, optax_facts, seed, batches, integrity]
    _reset()
    hooks: dict = {"multiprocessing.util": [guard("multiprocessing hook")(_on_mp_util)]}
    for mod in _modules:
        for name, fn in getattr(mod, "HOOKS", {}).items():
            hooks.setdefault(name, []).append(guard(f"{mod.__name__.split('.')[-1]} hook {name}")(fn))
    sys.meta_path.insert(0, _PostImportFinder(hooks))
    for mod in _modules:
        if hasattr(mod, "on_install"):
            guard(f"{mod.__name__} install")(mod.on_install)()
    atexit.register(_write_report)  # first registered: runs last, after every finalise
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    report["install_ms"] = round((time.perf_counter() - t0) * 1000, 3)
