"""The probe's body: post-import hooks that record device facts, and one JSON report per process.

Owns: what a captured process did on its devices (torch module/input devices, optimizer config,
torch.compile recompiles and graph breaks, PyTorch/XLA metrics, JAX compiles and host reads).
Must not: import any framework the user's program does not import itself, raise into the user's
program, print anything, or change an exit code. Every probe error goes to the report's `errors`.
Standard library only: it runs inside the environment under test, which has no ladder installed.
Timestamps are epoch seconds (time.time()), the clock of the runner's log lines.
"""

from __future__ import annotations

import atexit
import math
import os
import sys
import time

SCHEMA = 1
_MAX_EVENTS = 2000  # per list: a run that recompiles every step must not grow the report without bound
_MAX_ERRORS = 50

_state: dict = {}
_opts: dict = {}
_installed = False
_finalised = False
_quiet = False  # set while the probe reads its own values back: those reads are not the program's


def record_error(where: str, exc: BaseException) -> None:
    try:
        import traceback

        errs = _state.setdefault("errors", [])
        if len(errs) < _MAX_ERRORS:
            tb = traceback.extract_tb(exc.__traceback__)[-1:] if exc.__traceback__ else []
            loc = f" at {tb[0].filename}:{tb[0].lineno}" if tb else ""
            errs.append(f"{where}: {type(exc).__name__}: {exc}{loc}")
    except Exception:
        pass


def _guard(where: str):
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


def _append(lst: list, item) -> None:
    if len(lst) < _MAX_EVENTS:
        lst.append(item)


def _jsonable(v):
    if v is None or isinstance(v, (bool, int, str)):
        return v
    if isinstance(v, float):
        return v if math.isfinite(v) else repr(v)
    if isinstance(v, (list, tuple)):
        return [_jsonable(x) for x in v]
    if isinstance(v, dict):
        return {str(k): _jsonable(x) for k, x in v.items()}
    try:  # a 0-d tensor (a tensor learning rate, a capturable step)
        if hasattr(v, "numel") and v.numel() == 1:
            return float(v.item())
    except Exception:
        pass
    return repr(v)[:200]


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


def _wrap_loader(loader, fullname: str, hook) -> None:
    original = loader.exec_module

    def exec_module(module):
        original(module)  # the user's import error, if any, propagates unchanged
        try:
            hook(module)
        except Exception as e:
            record_error(f"hook {fullname}", e)

    loader.exec_module = exec_module  # instance attribute: this loader serves only this module


# ---------------------------------------------------------------- torch

_torch_ready = False
_fwd_handle = None
_fwd_left = 0


def _on_torch(torch) -> None:
    global _torch_ready
    _state["frameworks"]["torch"] = str(getattr(torch, "__version__", "?"))
    from torch.optim.optimizer import register_optimizer_step_pre_hook  # already imported by torch

    register_optimizer_step_pre_hook(_optimizer_step_hook)
    _arm_forward_hook()
    _torch_ready = True
    if "torch._dynamo" in sys.modules:
        _on_dynamo(sys.modules["torch._dynamo"])
    atexit.register(_finalise)  # runs before torch's own exit handlers (LIFO)


def _arm_forward_hook() -> None:
    global _fwd_handle, _fwd_left
    if _fwd_handle is not None:
        return
    import torch.nn.modules.module as mm

    _fwd_left = int(_opts.get("forward_calls_per_sample", 2))
    _fwd_handle = mm.register_module_forward_pre_hook(_forward_pre_hook)


def _forward_pre_hook(module, args):
    # Installed only while sampling: with no global hook, Module.__call__ keeps its fast path.
    global _fwd_handle, _fwd_left
    try:
        t = _state["torch"]
        t["forward_samples"] += 1
        pdev = t["param_devices"]
        n = 0
        for p in module.parameters():
            d = p.device.type
            pdev[d] = pdev.get(d, 0) + 1
            if d not in t["first_seen"]:
                t["first_seen"][d] = {"t": time.time(), "module": type(module).__name__, "what": "param"}
            n += 1
            if n >= 4096:
                break
        idev = t["input_devices"]
        for a in args[:8] if isinstance(args, tuple) else ():
            d = getattr(getattr(a, "device", None), "type", None)
            if isinstance(d, str):
                idev[d] = idev.get(d, 0) + 1
                if d not in t["first_seen"]:
                    t["first_seen"][d] = {"t": time.time(), "module": type(module).__name__, "what": "input"}
        if len(t["modules"]) < 20 and type(module).__name__ not in t["modules"]:
            t["modules"].append(type(module).__name__)
        if _opts.get("param_nonfinite") and len(_modules_seen) < 8:
            import weakref

            _modules_seen.append(weakref.ref(module))
        _fwd_left -= 1
        if _fwd_left <= 0 and _fwd_handle is not None:
            _fwd_handle.remove()
            _fwd_handle = None
    except Exception as e:
        record_error("forward hook", e)
    return None


_modules_seen: list = []
_IMPL_KEYS = ("params",)
_every = 50
_ignore: frozenset = frozenset({"params", "lr", "initial_lr"})


def _group_config(group: dict) -> dict:
    return {k: _jsonable(v) for k, v in group.items() if k not in _IMPL_KEYS}


def _getters(optimizer) -> list:
    from operator import itemgetter

    return [itemgetter(*sorted(k for k in g if k not in _ignore)) for g in optimizer.param_groups]


def _fingerprint(optimizer, getters: list) -> list | None:
    # cheap enough for every step (C itemgetters; unchanged floats compare by identity); a group
    # added or a key removed changes the structure, which is a change too
    groups = optimizer.param_groups
    if len(groups) != len(getters):
        return None
    try:
        return [get(g) for get, g in zip(getters, groups)]
    except KeyError:
        return None


def _optimizer_step_hook(optimizer, args, kwargs):
    try:
        o = _state["optimizer"]
        step = o["steps"] = o["steps"] + 1
        if _kept(step):
            o["step_times"].append([step, time.time()])
            if _grad_norms_on and _gn["owner"] in (None, id(optimizer)) and _gn_due(step):
                t0 = time.perf_counter()
                _torch_grad_norm(optimizer, step)
                c = time.perf_counter() - t0
                if _gn.get("timed"):  # the first call pays one-off set-up: not a per-step cost
                    recent = _gn["recent"] = (_gn.get("recent") or [])[-4:] + [c]
                    _gn["cost"] = sorted(recent)[len(recent) // 2]  # the median of the last 5: a hiccup passes
                _gn["timed"] = True
        if _every > 0 and step % _every == 0:
            _arm_forward_hook()
        key = id(optimizer)
        if key in _optimizers:
            getters, last = _last_cfg[key]
            fp = _fingerprint(optimizer, getters)
            if fp is None or fp != last:
                getters = _getters(optimizer)
                _last_cfg[key] = (getters, _fingerprint(optimizer, getters))
                _append(_optimizers[key]["changes"], {"step": step, "t": time.time(), "param_groups":
                                                      [_group_config(g) for g in optimizer.param_groups]})
            return
        cls = type(optimizer)
        rec = {"class": f"{cls.__module__}.{cls.__qualname__}", "name": cls.__name__, "framework": "torch",
               "first_step": step, "t": time.time(),
               "param_groups": [_group_config(g) for g in optimizer.param_groups],
               "group_sizes": [len(g.get("params", ())) for g in optimizer.param_groups], "changes": []}
        _optimizers[key] = rec
        _state["optimizers"].append(rec)
        getters = _getters(optimizer)
        _last_cfg[key] = (getters, _fingerprint(optimizer, getters))
    except Exception as e:
        record_error("optimizer hook", e)


_optimizers: dict = {}
_last_cfg: dict = {}


def _kept(step: int) -> bool:
    # all of the first 2000 steps, then every 10th, then every 100th: bounded, still mappable
    return step <= 2000 or (step <= 20000 and step % 10 == 0) or step % 100 == 0


# ---------------------------------------------------------------- gradient norms
# The global L2 norms of the gradient the optimizer is handed and of the parameters it updates (torch: at
# optimizer.step, so after any clipping or unscaling the program did first; optax: the input of the first
# optimizer transformation built, so after a clip placed before it in a chain). Torch values stay on the
# device until exit: no host round-trip during training. Only the first optimizer's series is kept;
# each point is [step, grad norm, param norm].

_grad_norms_on = True
_gn_budget = 0.02  # at most about this share of a step's time goes to the norms (probe option grad_norm_budget)
_MAX_GRAD_NORMS = 5000
_gn: dict = {"owner": None, "values": [], "source": None}


def _gn_due(step: int) -> bool:
    """Record at this step? Every step, unless that would cost more than grad_norm_budget of the step
    time: then every k-th step, k = cost / (budget x step time), so tiny CPU steps pay about the budget."""
    now = time.perf_counter()
    last = _gn.get("t")
    _gn["t"] = now
    if last is not None:
        dt = now - last
        _gn["interval"] = dt if _gn.get("interval") is None else 0.8 * _gn["interval"] + 0.2 * dt
    cost, interval = _gn.get("cost"), _gn.get("interval")
    k = 1
    if cost is not None and interval and _gn_budget > 0:
        k = max(1, math.ceil(cost / (_gn_budget * interval)))
    if step - _gn.get("last_step", -10**9) < k:
        return False
    _gn["last_step"] = step
    return True


def _torch_grad_norm(optimizer, step: int) -> None:
    torch = sys.modules["torch"]
    compiler = getattr(torch, "compiler", None)
    if compiler is not None and compiler.is_compiling():
        return  # inside a traced step: tensor work here would enter the user's graph
    params = [p for g in optimizer.param_groups for p in g["params"] if getattr(p, "grad", None) is not None]
    if not params or len(_gn["values"]) >= _MAX_GRAD_NORMS:
        return
    grads = [p.grad for p in params]
    if any(g.is_sparse for g in grads):
        return
    _gn["owner"], _gn["source"] = id(optimizer), "torch optimizer.step"
    n = len(params)
    with torch.no_grad():
        dev = grads[0].device
        if dev.type in ("cpu", "cuda") and all(t.device == dev for t in grads + params):
            # one fused kernel for all 2n norms on CUDA, then one reduction: [grad norm, param norm]
            norms = torch._foreach_norm(grads + params)
            if len({t.dtype for t in norms}) > 1:
                norms = [t.float() for t in norms]
            both = torch.linalg.vector_norm(torch.stack(norms).float().view(2, n), dim=1)
        else:  # XLA (basic ops only: nothing that could fall back to the CPU) or tensors on several devices
            both = torch.stack([torch.sqrt(sum((t.detach().float() ** 2).sum().to(dev) for t in ts))
                                for ts in (grads, params)])
    _gn["values"].append((step, both))


def _optax_grad_norm(value, pvalue=None) -> None:
    global _quiet
    try:
        _gn["calls"] = n = _gn.get("calls", 0) + 1
        if _kept(n) and len(_gn["values"]) < _MAX_GRAD_NORMS:
            _quiet = True
            try:
                _gn["values"].append((n, float(value)))
                if pvalue is not None:
                    _gn.setdefault("pvalues", []).append(float(pvalue))
            finally:
                _quiet = False
    except Exception as e:
        record_error("optax grad norm", e)


def _wrap_optax_update(tx, name: str):
    update = tx.update
    jax, optax = sys.modules["jax"], sys.modules["optax"]

    def wrapped_update(updates, state, params=None, *args, **kwargs):
        try:
            if params is None:
                jax.debug.callback(_optax_grad_norm, optax.global_norm(updates))
            else:
                jax.debug.callback(_optax_grad_norm, optax.global_norm(updates), optax.global_norm(params))
        except Exception as e:
            record_error("optax grad norm", e)
        return update(updates, state, params, *args, **kwargs)

    _gn["owner"], _gn["source"] = id(tx), f"optax.{name} update"
    return tx._replace(update=wrapped_update)


def _collect_grad_norms() -> None:
    """Reads the kept norms back once, at exit (after the counters were snapshotted)."""
    global _quiet
    vals = _gn["values"]
    if not vals:
        return
    _quiet = True
    try:
        torch = sys.modules.get("torch")
        if not isinstance(vals[0][1], float):  # torch: a [grad, param] tensor per kept step
            ts = [v for _, v in vals]
            pairs = (torch.stack([t.to(ts[0].device) for t in ts]).cpu().tolist() if ts[0].device.type != "xla"
                     else [t.cpu().tolist() for t in ts])
        else:  # optax: floats, with the parameter norms beside them when update() was given params
            pv = _gn.get("pvalues") or []
            pairs = [[v, pv[i]] if i < len(pv) else [v] for i, (_, v) in enumerate(vals)]
        out = []
        for (s, _), pair in zip(vals, pairs):
            out.append([s] + [float(x) if math.isfinite(float(x)) else repr(float(x)) for x in pair])
        _state["grad_norms"] = {"source": _gn["source"], "values": out}
    finally:
        _quiet = False


# ---------------------------------------------------------------- torch.compile (dynamo)

_dynamo_done = False


def _on_dynamo(dynamo) -> None:
    global _dynamo_done
    if _dynamo_done or not _torch_ready:
        return  # torch's own hook sets this up once torch has finished importing
    _dynamo_done = True
    import logging

    import torch

    _state["frameworks"]["torch._dynamo"] = _state["frameworks"].get("torch", "?")
    if not os.environ.get("TORCH_LOGS"):
        # set_logs replaces the whole logging config; the user set none, so nothing of theirs is lost.
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
        quiet = True
    else:
        quiet = False
    for name, kind in (("torch._dynamo.guards.__recompiles", "recompiles"),
                       ("torch._dynamo.symbolic_convert.__graph_breaks", "graph_breaks")):
        lg = logging.getLogger(name)
        lg.addHandler(_dynamo_handler(kind))
        if quiet:
            lg.propagate = False  # keep the user's stderr exactly as without the probe
    # Past config.recompile_limit dynamo stops compiling the function and runs it eagerly, with one
    # warning on this logger and no further recompile records: the probe keeps that warning.
    logging.getLogger("torch._dynamo.convert_frame").addHandler(_dynamo_handler("recompile_limit"))


def _make_handler_class():
    import logging

    class Handler(logging.Handler):
        def __init__(self, kind: str) -> None:
            super().__init__(level=logging.DEBUG)
            self.kind = kind

        def emit(self, record) -> None:
            try:
                msg = record.getMessage()
                lst = _state["dynamo"][self.kind]
                first = msg.strip().splitlines()[0] if msg.strip() else ""
                if self.kind == "recompile_limit" and "hit config." not in msg:
                    return
                item = {"t": record.created, "message": msg[:1500]}
                if self.kind == "recompiles" and first.startswith("Recompiling function"):
                    item["function"] = first.split("Recompiling function", 1)[1].strip().split(" in ")[0]
                    reasons = [ln.strip()[2:] for ln in msg.splitlines() if ln.strip().startswith("- ")
                               and "User stack" not in ln and "File " not in ln]
                    item["reason"] = reasons[0] if reasons else ""
                if self.kind == "recompile_limit":
                    for ln in msg.splitlines():
                        if ln.strip().startswith("function:"):
                            item["function"] = ln.split(":", 1)[1].strip()
                    item["reason"] = first
                if self.kind == "graph_breaks":
                    for ln in msg.splitlines():
                        if ln.startswith("Graph Break Reason:"):
                            item["reason"] = ln.split(":", 1)[1].strip()
                            break
                    item["where"] = first
                _append(lst, item)
            except Exception as e:
                record_error("dynamo log handler", e)

    return Handler


_DynamoHandler = None


def _dynamo_handler(kind: str):
    global _DynamoHandler
    if _DynamoHandler is None:
        _DynamoHandler = _make_handler_class()
    return _DynamoHandler(kind)


def _snapshot_dynamo() -> None:
    utils = sys.modules.get("torch._dynamo.utils")
    if utils is None or not hasattr(utils, "counters"):
        return
    counters = {}
    for k, v in utils.counters.items():
        try:
            counters[str(k)] = {str(kk)[:300]: int(vv) for kk, vv in dict(v).items()}
        except Exception:
            pass
    _state["dynamo"]["counters"] = counters


# ---------------------------------------------------------------- torch_xla

def _on_torch_xla(torch_xla) -> None:
    _state["frameworks"]["torch_xla"] = str(getattr(torch_xla, "__version__", "?"))
    # torch_xla registered its exit handler while importing; ours, registered now, runs before it.
    atexit.register(_finalise)


def _metric(met, name: str) -> dict | None:
    if name not in met.metric_names():
        return None
    total, acc, samples = met.metric_data(name)
    return {"count": int(total), "total": float(acc),
            "samples": [[float(t), float(v)] for t, v in list(samples)[:_MAX_EVENTS]]}


def _snapshot_xla() -> None:
    if "torch_xla" not in sys.modules:
        return
    import torch_xla.debug.metrics as met

    x = _state["xla"]
    counters = {}
    for name in met.counter_names():
        if name.startswith("aten::") or name in ("UncachedCompile", "CachedCompile", "MarkStep",
                                                 "ExecuteComputation", "ExecuteReplicated"):
            counters[name] = int(met.counter_value(name))
    x["counters"] = counters
    x["aten"] = {k: v for k, v in counters.items() if k.startswith("aten::")}
    for key, name in (("compile", "CompileTime"), ("execute", "ExecuteTime"),
                      ("execute_replicated", "ExecuteReplicatedTime"),
                      ("transfer_from_device", "TransferFromDeviceTime"),
                      ("transfer_to_device", "TransferToDeviceTime")):
        m = _metric(met, name)
        if m is not None:
            if key != "compile":
                m["samples"] = m["samples"][:50]  # only compile times are mapped to steps
            x[key] = m
    try:
        import torch_xla.runtime as xr

        x["device_type"] = xr.device_type()
        if x.get("execute") or x.get("compile"):  # the runtime is up; asking does not start it
            x["device_count"] = int(xr.global_runtime_device_count())
    except Exception as e:
        record_error("xla runtime facts", e)


# ---------------------------------------------------------------- JAX

def _on_jax(jax) -> None:
    _state["frameworks"]["jax"] = str(getattr(jax, "__version__", "?"))
    mon = jax.monitoring
    mon.register_event_duration_secs_listener(_jax_duration_listener)
    mon.register_event_listener(_jax_event_listener)
    arr = sys.modules.get("jax._src.array")
    cls = getattr(arr, "ArrayImpl", None)
    prop = getattr(cls, "_value", None) if cls is not None else None
    if isinstance(prop, property) and prop.fget is not None:
        fget = prop.fget

        def _value(self):
            # _npy_value is None until the array has been read back: this read is a host transfer
            if not _quiet and getattr(self, "_npy_value", 1) is None:
                _state["jax"]["host_reads"] += 1
            return fget(self)

        cls._value = property(_value, doc=prop.__doc__)
    else:
        _state["jax"]["host_reads"] = None
    atexit.register(_finalise)


def _jax_duration_listener(event, duration, **kw):
    try:
        if event == "/jax/core/compile/backend_compile_duration":
            j = _state["jax"]
            _append(j["compiles"], {"t": time.time(), "function": str(kw.get("fun_name", "?")),
                                    "duration_s": float(duration)})
            if j.get("backend") is None:
                _snapshot_jax_backend()
    except Exception as e:
        record_error("jax listener", e)


def _jax_event_listener(event, **kw):
    try:
        if event == "/jax/compilation_cache/cache_hits":
            _append(_state["jax"]["cache_hits"], {"t": time.time()})
    except Exception as e:
        record_error("jax listener", e)


def _snapshot_jax_backend() -> None:
    jax = sys.modules.get("jax")
    xb = sys.modules.get("jax._src.xla_bridge")
    if jax is None or xb is None or not getattr(xb, "_backends", None):
        return  # the user never started a backend; asking would start one
    j = _state["jax"]
    j["backend"] = jax.default_backend()
    devs = jax.devices()
    j["platforms"] = sorted({d.platform for d in devs})
    j["device_count"] = len(devs)


# ---------------------------------------------------------------- optax (JAX has no optimizer hook)

_OPTAX_FNS = ("sgd", "adam", "adamw", "nadam", "nadamw", "rmsprop", "adagrad", "adafactor", "lamb",
              "lion", "lars", "adabelief", "radam", "adamax", "adamaxw", "noisy_sgd", "adadelta")


def _on_optax(optax) -> None:
    _state["frameworks"]["optax"] = str(getattr(optax, "__version__", "?"))
    import inspect

    for name in _OPTAX_FNS:
        fn = getattr(optax, name, None)
        if fn is None or getattr(fn, "_ladder_wrapped", False):
            continue
        try:
            sig = inspect.signature(fn)
        except (TypeError, ValueError):
            continue
        setattr(optax, name, _wrap_optax(name, fn, sig))


def _wrap_optax(name: str, fn, sig):
    def wrapped(*args, **kwargs):
        try:
            bound = sig.bind_partial(*args, **kwargs)
            bound.apply_defaults()
            params = {k: _jsonable(v) if not callable(v) else "<schedule>" for k, v in bound.arguments.items()}
            _append(_state["optimizers"], {"class": f"optax.{name}", "name": name, "framework": "optax",
                                           "first_step": None, "t": time.time(),
                                           "param_groups": [params], "changes": []})
        except Exception as e:
            record_error("optax wrapper", e)
        tx = fn(*args, **kwargs)
        if _grad_norms_on and _gn["owner"] is None and hasattr(tx, "_replace") and hasattr(tx, "update"):
            try:
                tx = _wrap_optax_update(tx, name)
            except Exception as e:
                record_error("optax grad norm", e)
        return tx

    wrapped._ladder_wrapped = True
    wrapped.__name__ = name
    wrapped.__doc__ = fn.__doc__
    wrapped.__wrapped__ = fn
    return wrapped


# ---------------------------------------------------------------- exit

def _check_params_nonfinite() -> None:
    torch = sys.modules.get("torch")
    if torch is None or not _opts.get("param_nonfinite"):
        return
    bad = []
    for ref in _modules_seen:
        m = ref()
        if m is None:
            continue
        for name, p in m.named_parameters():
            if not bool(torch.isfinite(p.detach()).all()):
                bad.append(f"{type(m).__name__}.{name}")
    _state["nonfinite_params"] = sorted(set(bad))[:50]


def _finalise() -> None:
    """Reads the frameworks' counters once, before their own exit handlers clear them."""
    global _finalised
    if _finalised:  # atexit handlers run one at a time: a flag is enough
        return
    _finalised = True
    for where, fn in (("xla metrics", _snapshot_xla), ("dynamo counters", _snapshot_dynamo),
                      ("jax backend", _snapshot_jax_backend), ("param check", _check_params_nonfinite),
                      ("gradient norms", _collect_grad_norms)):
        try:
            fn()
        except Exception as e:
            record_error(where, e)


def _write_report() -> None:
    out = os.environ.get("LADDER_PROBE_DIR")
    if not out:
        return
    try:
        import json

        t0 = time.perf_counter()
        _finalise()
        _state["ended_at"] = time.time()
        if not _state["jax"]["compiles"] and "jax" not in _state["frameworks"]:
            _state["jax"] = None
        if "torch_xla" not in _state["frameworks"]:
            _state["xla"] = None
        if "torch._dynamo" not in _state["frameworks"]:
            _state["dynamo"] = None
        json.dumps(_state, default=repr)  # encoded twice so the report can say what writing it cost
        _state["exit_ms"] = round((time.perf_counter() - t0) * 1000, 3)
        os.makedirs(out, exist_ok=True)
        path = os.path.join(out, f"probe-{os.getpid()}.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(_state, f, default=repr)
        os.replace(tmp, path)
    except Exception as e:  # nowhere left to record it; the user's exit must not change
        try:
            with open(os.path.join(out, f"probe-{os.getpid()}.error"), "w") as f:
                f.write(f"{type(e).__name__}: {e}\n")
        except Exception:
            pass


def _after_fork_in_child() -> None:
    # A forked child (multiprocessing 'fork') inherits the parent's state: start its own report.
    _reset_state()
    _optimizers.clear()
    _last_cfg.clear()
    _gn.clear()
    _gn.update(owner=None, values=[], pvalues=[], source=None, calls=0)
    global _finalised
    _finalised = False


class _Anchor:
    """multiprocessing.util.register_after_fork keeps a weak reference to an object: this one."""


_anchor = _Anchor()


def _on_mp_util(util) -> None:
    # multiprocessing ends a forked child with os._exit, which skips atexit, and clears the
    # finalizers it inherited; the after-fork callbacks run after that clearing, so register there.
    util.register_after_fork(_anchor, lambda _obj: util.Finalize(None, _write_report, exitpriority=-1000))


def _reset_state() -> None:
    frameworks = dict(_state.get("frameworks", {}))
    _state.clear()
    _state.update({
        "schema": SCHEMA, "pid": os.getpid(), "ppid": os.getppid(), "argv": list(sys.argv)[:20],
        "started_at": time.time(), "ended_at": None, "options": dict(_opts),
        "frameworks": frameworks, "errors": [],
        "torch": {"forward_samples": 0, "param_devices": {}, "input_devices": {}, "first_seen": {},
                  "modules": []},
        "optimizer": {"steps": 0, "step_times": []},
        "optimizers": [],
        "dynamo": {"recompiles": [], "graph_breaks": [], "recompile_limit": [], "counters": {}},
        "xla": {},
        "jax": {"backend": None, "platforms": [], "device_count": None, "compiles": [],
                "cache_hits": [], "host_reads": 0},
        "nonfinite_params": None,
    })


def _configure() -> None:
    global _every, _ignore, _grad_norms_on, _gn_budget
    try:
        _grad_norms_on = bool(_opts.get("grad_norms", True))
        _gn_budget = float(_opts.get("grad_norm_budget", 0.02))
        _every = int(_opts.get("sample_every", 50))
        _ignore = frozenset(["params", *_opts.get("optimizer_ignore", ["lr", "initial_lr"])])
    except Exception as e:  # a bad option: keep the defaults, say so
        record_error("options", e)


def install() -> None:
    """Called by sitecustomize at start-up. Idempotent."""
    global _installed, _opts
    if _installed:
        return
    _installed = True
    t0 = time.perf_counter()
    raw = os.environ.get("LADDER_PROBE_OPTS")
    _opts = {}
    if raw:
        import json

        try:
            _opts = json.loads(raw)
        except ValueError:
            pass
        if not isinstance(_opts, dict):
            _opts = {}
    _reset_state()
    _configure()
    hooks = {"torch": _guard("torch hook")(_on_torch),
             "torch._dynamo": _guard("dynamo hook")(_on_dynamo),
             "torch_xla": _guard("torch_xla hook")(_on_torch_xla),
             "jax": _guard("jax hook")(_on_jax),
             "optax": _guard("optax hook")(_on_optax),
             "multiprocessing.util": _guard("multiprocessing hook")(_on_mp_util)}
    sys.meta_path.insert(0, _PostImportFinder(hooks))
    atexit.register(_write_report)  # first registered: runs last, after every _finalise
    if hasattr(os, "register_at_fork"):
        os.register_at_fork(after_in_child=_after_fork_in_child)
    _state["install_ms"] = round((time.perf_counter() - t0) * 1000, 3)
