"""torch facts: where modules and inputs live, the optimizer and its parameter groups, gradient norms at
the optimizer step, host reads of tensors, evaluation windows, gradient clipping, skipped steps
(GradScaler) and torch.compile's recompiles and graph breaks.

Must not change what the program computes: nothing here runs inside a step that dynamo traces, and on
PyTorch/XLA the gradient norms are computed at every step (recording them only at some steps would
change the traced graph on the others, and XLA would compile it twice); only which of them are kept
varies. An optimizer built again over parameters of the same shapes, once the measured one has stopped
stepping (a checkpoint resumed), takes over the norms: the curve goes on, and the step's graph keeps them.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
import time
import weakref

import _ladder_probe as core
from _ladder_probe import batches, seed

SNAPSHOT_ORDER = 2
_READ_METHODS = ("item", "tolist", "numpy", "cpu", "__float__", "__int__", "__bool__", "__index__")
_IMPL_KEYS = ("params",)

_s: dict = {}
_tls = threading.local()


def reset() -> None:
    _s.clear()
    _s.update(forward_samples=0, param_devices={}, param_dtypes={}, autocast={}, input_devices={}, first_seen={},
              last_step={}, modules=[], fwd_handle=None, fwd_left=0, pinned=False, h2d_dtypes={}, input_dtypes={}, root=None, root_params=0, optimizers={}, eval_windows=[],
              window=None, steps_in_eval={"steps": 0, "first": None, "module": None}, clip=None, scaler_steps=0,
              scaler_skipped=0, gn_cost=None, gn_recent=[], stale={"steps": 0, "judged": 0, "first": None},
              zeroed=True, grad_ref=None, schedule_first=[],
              dropout={"steps": 0, "layers": 0, "on": [], "off": [], "zero_rate": False},
              ckpt={"calls": 0, "dropout_calls": 0},
              clip_cover={"calls": 0, "min_elements": None, "max_elements": None, "first_empty": None},
              gn_interval=None, gn_t=None, gn_timed=False, xla_live=None, modules_seen=[],
              upd_pending=None, upd_window=[], upd_io=None, upd_live=None,
              dynamo={"recompiles": [], "graph_breaks": [], "recompile_limit": [], "counters": {}})


reset()


_IS_COMPILING = [lambda: False]  # torch.compiler.is_compiling once torch loads: called bare, dynamo folds it


def _compiling() -> bool:
    torch = sys.modules.get("torch")
    compiler = getattr(torch, "compiler", None) if torch is not None else None
    try:
        return bool(compiler is not None and compiler.is_compiling())
    except Exception:
        return False


# ---------------------------------------------------------------- import hooks

def on_torch(torch) -> None:
    import atexit

    core.framework("torch", str(getattr(torch, "__version__", "?")))
    compiler = getattr(torch, "compiler", None)
    if callable(getattr(compiler, "is_compiling", None)):
        _IS_COMPILING[0] = compiler.is_compiling
    from torch.optim.optimizer import register_optimizer_step_post_hook, register_optimizer_step_pre_hook

    register_optimizer_step_pre_hook(_optimizer_pre_hook)
    register_optimizer_step_post_hook(_optimizer_post_hook)
    _arm_forward_hook()
    for name in _READ_METHODS:
        _wrap_read(torch.Tensor, name)
    _wrap_shape_reads(torch)
    _wrap_host_copies(torch)
    _wrap_scheduler(torch)
    _wrap_train(torch.nn.Module)
    _wrap_compile(torch)
    for cls in (torch.optim.Optimizer, torch.nn.Module):
        _wrap_zero_grad(cls)
    _wrap_backward(torch.autograd)
    _wrap_loader()
    wrap_clip()
    _wrap_scaler(torch)
    _s["ready"] = True
    if "torch._dynamo" in sys.modules:
        on_dynamo(sys.modules["torch._dynamo"])
    atexit.register(core.finalise)  # runs before torch's own exit handlers (LIFO)


def on_checkpoint(mod) -> None:
    """torch.utils.checkpoint and torch_xla.utils.checkpoint: their `checkpoint`, wrapped once the module is
    imported, before a program's `from ... import checkpoint` binds it."""
    orig = getattr(mod, "checkpoint", None)
    if callable(orig) and not getattr(orig, "_ladder_wrapped", False):
        mod.checkpoint = _checkpoint_wrapper(orig)


HOOKS = {"torch": on_torch, "torch.utils.checkpoint": on_checkpoint, "torch_xla.utils.checkpoint": on_checkpoint}


# ---------------------------------------------------------------- host reads

def _wrap_loader() -> None:
    """A DataLoader's next batch runs the dataset's and the collate function's code on host tensors: reads
    there are the input pipeline's (core.loading), not the training step's."""
    try:
        from torch.utils.data import dataloader
    except Exception as e:  # a torch without the data package: nothing to separate
        core.record_error("torch data loader", e)
        return
    cls = dataloader._BaseDataLoaderIter
    orig = cls.__next__
    if getattr(orig, "_ladder_wrapped", False):
        return

    @functools.wraps(orig)
    def __next__(self):
        with core.loading():
            return orig(self)

    __next__._ladder_wrapped = True
    cls.__next__ = __next__
    init = cls.__init__

    @functools.wraps(init)
    def __init__(self, loader, *args, **kwargs):
        init(self, loader, *args, **kwargs)
        try:
            seed.note_loader(loader, sys._getframe(1))
        except Exception as e:  # never into the program
            core.record_error("loader generator", e)

    cls.__init__ = __init__


def _wrap_read(cls, name: str) -> None:
    orig = getattr(cls, name, None)
    if orig is None or getattr(orig, "_ladder_wrapped", False):
        return
    count = core.reads.count

    if name == "__index__":
        def method(self, *a, **k):
            # A CPU tensor used as a Python index (`data[i:i + n] for i in torch.randint(...)`, nanoGPT's
            # sampler) is input preparation: it moves no device value, and a port does the same with numpy.
            # Counted apart as data, so that it does not raise the reference's rate (on a CPU reference it
            # did, 48 reads a step). An accelerator tensor used as an index is a device read, as before.
            count(name, data=bool(getattr(self, "is_cpu", False)))
            return orig(self, *a, **k)
    else:
        def method(self, *a, **k):
            count(name, host=bool(getattr(self, "is_cpu", False)))
            return orig(self, *a, **k)

    method.__name__ = getattr(orig, "__name__", name)
    method.__qualname__ = f"Tensor.{name}"
    method.__doc__ = getattr(orig, "__doc__", None)
    method._ladder_wrapped = True
    method.__wrapped__ = orig
    setattr(cls, name, method)


def _wrap_shape_reads(torch) -> None:
    """Ops whose output size is the data's (nonzero, masked_select, indexing by a boolean mask): on an
    accelerator the host must read the count before anything after them can be built (on PyTorch/XLA each one
    executes the pending graph and runs aten::nonzero on the CPU). Counted as host reads on every device, so a
    port that filters each batch with a mask the reference never used reads more than it."""
    for name in ("nonzero", "masked_select"):
        _wrap_read(torch.Tensor, name)
        orig = getattr(torch, name, None)
        if orig is not None and not getattr(orig, "_ladder_wrapped", False):
            setattr(torch, name, _counting_function(orig, name))
    orig = torch.Tensor.__getitem__
    if getattr(orig, "_ladder_wrapped", False):
        return
    Tensor, masks, count = torch.Tensor, (torch.bool, torch.uint8), core.reads.count

    def is_mask(i) -> bool:
        return isinstance(i, Tensor) and i.dtype in masks

    def __getitem__(self, idx):
        if is_mask(idx) or (type(idx) is tuple and any(is_mask(i) for i in idx)):
            if not _compiling():
                count("mask_index")
        return orig(self, idx)

    __getitem__._ladder_wrapped = True
    __getitem__.__wrapped__ = orig
    __getitem__.__qualname__ = "Tensor.__getitem__"
    __getitem__.__doc__ = orig.__doc__
    Tensor.__getitem__ = __getitem__


def _wrap_host_copies(torch) -> None:
    """Copies of a device tensor into host memory through no read method: a host tensor written from a device's
    (`host_buf[i] = loss.detach()`, a loss log created without `device=`), `host.copy_(t)` and `t.to("cpu")`.
    Each waits for the device and moves the value, as `.cpu()` does; on a CPU reference none of them is a copy
    from another device, so nothing is counted there."""
    Tensor, device_cls, count = torch.Tensor, torch.device, core.reads.count

    def off_host(t) -> bool:
        return isinstance(t, Tensor) and t.device.type not in ("cpu", "meta")

    def to_host(a, k) -> bool:
        d = k.get("device", a[0] if a else None)
        if isinstance(d, Tensor):
            d = d.device
        if isinstance(d, str):
            d = device_cls(d)
        return isinstance(d, device_cls) and d.type == "cpu"

    def setitem(orig):
        def __setitem__(self, idx, value):
            if self.is_cpu and off_host(value) and not _compiling():
                count("setitem_to_host")
            return orig(self, idx, value)
        return __setitem__

    def copy_(orig):
        def copy_(self, src, *a, **k):
            if self.is_cpu and off_host(src) and not _compiling():
                count("copy_to_host")
            return orig(self, src, *a, **k)
        return copy_

    def to(orig):
        def to(self, *a, **k):
            if (a or k) and not self.is_cpu and self.device.type != "meta" and to_host(a, k) and not _compiling():
                count("to_cpu")
            out = orig(self, *a, **k)
            if not _IS_COMPILING[0]() and self.is_cpu and out is not self and self.is_floating_point():
                try:
                    if out.device.type not in ("cpu", "meta"):
                        # floating-point host data sent to a device, by the dtype it arrives in (ladder.checks.l2:
                        # data rounded to bfloat16 on the way, then computed on in float32)
                        d = str(out.dtype).replace("torch.", "")
                        h2d = _s["h2d_dtypes"]
                        h2d[d] = h2d.get(d, 0) + 1
                except Exception as e:  # never into the program
                    core.record_error("transfer dtype", e)
            if not _IS_COMPILING[0]() and self.is_cpu and out is not self and (not batches.full()
                                                                               or batches.wants_moments()):
                try:
                    if out.device.type not in ("cpu", "meta"):
                        batches.remember_copy(out, batches.torch_part(self))  # its input fingerprint, from the host
                        if self.is_floating_point() and self.dim() >= 2:
                            batches.remember_host(out, batches.torch_host(self))
                except Exception as e:  # never into the program
                    core.record_error("transfer fingerprint", e)
            return out
        return to

    for name, make in (("__setitem__", setitem), ("copy_", copy_), ("to", to)):
        orig = getattr(Tensor, name)
        if getattr(orig, "_ladder_wrapped", False):
            continue
        w = make(orig)
        w._ladder_wrapped = True
        w.__wrapped__ = orig
        w.__qualname__ = f"Tensor.{name}"
        w.__doc__ = orig.__doc__
        setattr(Tensor, name, w)


def _counting_function(orig, name: str):
    count = core.reads.count

    @functools.wraps(orig)
    def fn(*a, **k):
        count(name)
        return orig(*a, **k)

    fn._ladder_wrapped = True
    return fn


# ---------------------------------------------------------------- the step clock without an optimizer

def _wrap_backward(autograd) -> None:
    """A program that updates its parameters by hand (torch.func's grad, a written-out SGD) never calls
    optimizer.step, so its steps are counted at each backward pass: `Tensor.backward` and
    `torch.func.grad` go through `torch.autograd.backward` and `torch.autograd.grad`, looked up at call
    time. Not while dynamo traces, nor inside an evaluation window; an optimizer.step takes over."""
    for name in ("backward", "grad"):
        orig = getattr(autograd, name, None)
        if orig is None or getattr(orig, "_ladder_wrapped", False):
            continue

        def make(orig, name=name):
            @functools.wraps(orig)
            def wrapper(*a, **k):
                clock = core.clock
                depth = getattr(_tls, "backward", 0)
                if (not depth and clock.source in (None, "torch backward") and not clock.eval
                        and not core.is_quiet() and not _compiling()):
                    clock.tick("torch backward")
                _tls.backward = depth + 1  # a backward inside a backward (reentrant checkpointing) is one step
                try:
                    out = orig(*a, **k)
                finally:
                    _tls.backward = depth
                if name == "backward" and not depth and not clock.eval and not core.is_quiet() and not _compiling():
                    _sample_update_io()
                return out

            wrapper._ladder_wrapped = True
            return wrapper

        setattr(autograd, name, make(orig))


# ---------------------------------------------------------------- update samples (the update replayed)

# After each backward pass, the first elements of each parameter and of its gradient as the backward left it,
# before anything the program does by hand between the backward and optimizer.step (a decay added to the
# gradient, a clip, the parameters decayed): for the optimizer's first _UPD_WINDOW steps, the samples of the
# last backward before each step. ladder.checks.replay replays the reference's optimizer on them, so that an
# optimizer configured otherwise whose update, with what the program does by hand, is the reference's is
# told from one whose update differs. On XLA the samples are computed at every step and kept alive through its
# mark_step (the graph must not change when the window ends); elsewhere only in the window.
_UPD_ELEMENTS = 16
_UPD_LEAVES = 256
_UPD_WINDOW = 6
_UPD_GIVE_UP = 64  # backward passes with no optimizer step yet: an update written by hand, nothing to sample for


def _sample_update_io() -> None:
    try:
        if _s["upd_live"] is None and (len(_s["upd_window"]) >= _UPD_WINDOW or (
                not _s["optimizers"] and core.clock.step > _UPD_GIVE_UP)):
            return  # the window is full, or no optimizer steps, and nothing must be kept alive (not XLA)
        root = _s["root"]() if _s["root"] is not None else None
        if root is None:
            return
        torch = sys.modules["torch"]
        named = [(n, q) for n, q in root.named_parameters() if q.grad is not None and not q.grad.is_sparse
                 and q.dtype.is_floating_point][:_UPD_LEAVES]
        if not named:
            return
        dev = named[0][1].device
        if any(q.device != dev or q.grad.device != dev for _, q in named):
            return
        with torch.no_grad():
            ps = torch.cat([q.detach().reshape(-1)[:_UPD_ELEMENTS].float() for _, q in named])
            gs = torch.cat([q.grad.detach().reshape(-1)[:_UPD_ELEMENTS].float() for _, q in named])
        if _s["upd_io"] is None:
            _s["upd_io"] = {"paths": [n for n, _ in named], "shapes": [list(q.shape) for _, q in named],
                            "sizes": [min(_UPD_ELEMENTS, q.numel()) for _, q in named], "leaves": len(named)}
        elif _s["upd_io"]["leaves"] != len(named):
            return
        _s["upd_pending"] = (ps, gs)
        if dev.type == "xla":
            _s["upd_live"] = (ps, gs)  # alive through this step's mark_step at every step: one graph
    except Exception as e:
        core.record_error("update samples", e)


def _keep_update_io(step: int) -> None:
    """At optimizer.step: the samples of the last backward belong to this step (with the clip's norm where the
    program clipped this step, for the replay's clip)."""
    pending, _s["upd_pending"] = _s["upd_pending"], None
    if pending is None or len(_s["upd_window"]) >= _UPD_WINDOW:
        return
    clip = _s["clip"]
    norm = clip["norm"] if clip is not None and clip["step"] == step - 1 else None
    _s["upd_window"].append((step, pending, norm))


def _update_samples() -> dict | None:
    io, w = _s["upd_io"], _s["upd_window"]
    if io is None or len(w) < 2:
        return None
    first = w[0][0]
    params, grads, gnorm = [], [], []
    with core.quiet():
        for _, (ps, gs), norm in w:
            for flat, out in ((ps, params), (gs, grads)):
                vals, rows, i = flat.detach().cpu().tolist(), [], 0
                for n in io["sizes"]:
                    rows.append(vals[i:i + n])
                    i += n
                out.append(rows)
            v = float(norm.detach().float().cpu()) if norm is not None and hasattr(norm, "detach") else math.nan
            gnorm.append(v if math.isfinite(v) else math.nan)  # NaN: no clip norm this step (the replay clips nothing)
    steps = [s - first + 1 for s, _, _ in w]  # the optimizer's own steps, from 1
    return {"function": "torch optimizer.step", "paths": io["paths"], "shapes": io["shapes"],
            "leaves": io["leaves"], "elements": _UPD_ELEMENTS, "per_device": False,
            "windows": [{"steps": steps, "params": params, "grads": grads, "gnorm": gnorm}]}


# ---------------------------------------------------------------- evaluation windows

def _wrap_train(module_cls) -> None:
    orig = module_cls.train
    if getattr(orig, "_ladder_wrapped", False):
        return

    def train(self, mode: bool = True):
        depth = getattr(_tls, "train_depth", 0)
        if depth == 0:
            try:
                _window(self, bool(mode))
            except Exception as e:
                core.record_error("eval window", e)
        _tls.train_depth = depth + 1
        try:
            return orig(self, mode)
        finally:
            _tls.train_depth = depth

    train._ladder_wrapped = True
    train.__wrapped__ = orig
    train.__doc__ = orig.__doc__
    module_cls.train = train


def _window(module, training: bool) -> None:
    """A module switched to eval mode opens an evaluation window; switched back, it closes it. Inside a
    window, host reads and compiles are counted as evaluation's, and the module's forward calls (batches,
    and items: the first tensor argument's leading size) are counted."""
    w = _s["window"]
    if not training:
        if w is not None or not any(True for _ in module.parameters()):
            return
        handle = module.register_forward_pre_hook(_eval_forward, with_kwargs=True)
        _s["window"] = {"module": type(module).__name__, "ref": weakref.ref(module), "handle": handle,
                        "t0": time.time(), "step": core.clock.step, "batches": 0, "items": 0}
        core.clock.eval = True
        _arm_forward_hook()  # devices and precision are sampled in each evaluation too (an evaluation on a host copy)
        return
    if w is not None and w["ref"]() is module:
        _close_window()


def _trains(w: dict, optimizer) -> bool:
    """Does this optimizer train the module whose eval mode opened the window? A copy kept in eval mode for the
    evaluations (`copy.deepcopy(model).eval()`, its weights loaded before each) shares no parameter with it. The
    window's parameter ids are taken once; the optimizer's are scanned until the first shared one."""
    ids = w.get("param_ids")
    if ids is None:
        m = w["ref"]()
        ids = w["param_ids"] = frozenset(id(p) for p in m.parameters()) if m is not None else frozenset()
    return any(id(p) in ids for g in optimizer.param_groups for p in g.get("params", ()))


def _close_window() -> None:
    w = _s["window"]
    if w is None:
        return
    _s["window"] = None
    core.clock.eval = False
    try:
        w["handle"].remove()
    except Exception:
        pass
    core.append(_s["eval_windows"], {**{k: w[k] for k in ("module", "t0", "step", "batches", "items")},
                                     "t1": time.time()})


def _eval_forward(module, args, kwargs):
    if _IS_COMPILING[0]():  # a module inside a compiled one: its batches are not counted (no side effects traced)
        return None
    w = _s["window"]
    if w is None:
        return None
    if w.pop("counted", False):
        return None
    w["batches"] += 1
    for a in list(args[:4]) + list(kwargs.values())[:4]:
        shape = getattr(a, "shape", None)
        if shape is not None and len(shape) >= 1:
            w["items"] += int(shape[0])
            break
    return None


# ---------------------------------------------------------------- devices (sampled forward calls)

def _arm_forward_hook() -> None:
    if _s["fwd_handle"] is not None:
        if _s["pinned"]:  # installed for good (torch.compile): arming is only the count
            _s["fwd_left"] = max(_s["fwd_left"], int(core.opts.get("forward_calls_per_sample", 2)))
        return
    import torch.nn.modules.module as mm

    _s["fwd_left"] = int(core.opts.get("forward_calls_per_sample", 2))
    _s["fwd_handle"] = mm.register_module_forward_pre_hook(_forward_pre_hook)


def _pin_forward_hook() -> None:
    """torch.compile is in use: dynamo guards on the number of global forward hooks of every module it traces, so
    removing or adding the probe's hook would recompile the program's graphs. From now on the hook stays installed
    (it does nothing between samples, and nothing in a traced graph); installed now, before the first trace."""
    if _s["pinned"]:
        return
    _s["pinned"] = True
    import torch.nn.modules.module as mm

    if _s["fwd_handle"] is None:
        _s["fwd_left"] = 0
        _s["fwd_handle"] = mm.register_module_forward_pre_hook(_forward_pre_hook)
    orig = getattr(mm, "_has_any_global_hook", None)
    if orig is not None and not getattr(orig, "_ladder_wrapped", False):
        # torch warns at every call of a torch.compile(module) wrapper while any global hook is installed; the
        # probe's is not the program's, so it does not count (torch reads this function for that warning only)
        def _has_any_global_hook():
            if not orig():
                return False
            h = _s["fwd_handle"]
            pre = getattr(mm, "_global_forward_pre_hooks", {})
            if h is None or list(pre) != [getattr(h, "id", None)]:
                return True
            saved = dict(pre)
            pre.clear()
            try:
                return bool(orig())
            finally:
                pre.update(saved)

        _has_any_global_hook._ladder_wrapped = True
        mm._has_any_global_hook = _has_any_global_hook


def _wrap_compile(torch) -> None:
    """torch.compile and Module.compile pin the forward hook (above) before they return: compilation is lazy, so
    every trace sees the hook that stays."""
    def wrap(owner, name):
        orig = getattr(owner, name, None)
        if orig is None or getattr(orig, "_ladder_wrapped", False):
            return

        @functools.wraps(orig)
        def compile_(*a, **k):
            try:
                _pin_forward_hook()
            except Exception as e:  # never into the program
                core.record_error("compile", e)
            return orig(*a, **k)

        compile_._ladder_wrapped = True
        setattr(owner, name, compile_)

    wrap(torch, "compile")
    wrap(torch.nn.Module, "compile")


def _root_died(ref) -> None:
    """The model was freed (built anew: a checkpoint resumed into a new model): the next forward call names the
    new one, before its backward pass samples it (on XLA a step without the samples would build another graph)."""
    try:
        if _s.get("root") is ref:
            _arm_forward_hook()
    except Exception as e:  # never into the program
        core.record_error("root model", e)


def _forward_pre_hook(module, args):
    # Installed only while sampling: with no global hook, Module.__call__ keeps its fast path.
    if _IS_COMPILING[0]():
        # Traced by dynamo inside a compiled module (torch.compile(model)): is_compiling() is a constant there, so
        # the hook leaves no trace in the graph. The compiled wrapper's own call (eager) has already sampled it.
        return None
    w, inner = _s["window"], getattr(module, "_orig_mod", None)
    if w is not None and inner is not None and w["ref"]() is inner:
        # an evaluation batch through the compiled wrapper, counted here: the model's own hook may be traced (a no-op)
        # or run eagerly (torch versions differ); run eagerly, it skips the batch counted here
        w["counted"] = False
        _eval_forward(inner, args, {})
        w["counted"] = True
    if _s["fwd_left"] <= 0 or (_s["pinned"] and type(module).__module__.startswith("torch.fx")):
        return None  # pinned between samples, or a compiled backend's own graph module (not the program's)
    try:
        module = getattr(module, "_orig_mod", module)  # name the compiled wrapper's model, as in the reference
        _s["forward_samples"] += 1
        pdev, pdt, first, last = _s["param_devices"], _s["param_dtypes"], _s["first_seen"], _s["last_step"]
        step = core.clock.step
        n = 0
        for p in module.parameters():
            d = p.device.type
            pdev[d] = pdev.get(d, 0) + 1
            last[d] = step  # the optimizer steps taken before the latest sampled forward on this device
            t = str(p.dtype).replace("torch.", "")
            pdt[t] = pdt.get(t, 0) + 1
            if d not in first:
                first[d] = {"t": time.time(), "module": type(module).__name__, "what": "param", "step": step}
            n += 1
            if n >= 4096:
                break
        dead = _s["root"] is not None and _s["root"]() is None  # the model was built anew (a checkpoint resumed)
        if n > _s["root_params"] or (dead and n >= _s["root_params"]):
            # the outermost module: the one whose parameters are named for the report
            _s["root"], _s["root_params"] = weakref.ref(module, _root_died), n
            _watch_batches(module)
            _batch_hook(module, args, {})  # this call's hooks were gathered before the new hook: its input now
        idev, idt = _s["input_devices"], _s["input_dtypes"]
        for a in args[:8] if isinstance(args, tuple) else ():
            d = getattr(getattr(a, "device", None), "type", None)
            if isinstance(d, str):
                idev[d] = idev.get(d, 0) + 1
                last[d] = step
                if getattr(a, "is_floating_point", None) is not None and a.is_floating_point():
                    t = str(a.dtype).replace("torch.", "")
                    idt[t] = idt.get(t, 0) + 1
                if d not in first:
                    first[d] = {"t": time.time(), "module": type(module).__name__, "what": "input", "step": step}
        ac = _autocast_state()
        _s["autocast"][ac] = _s["autocast"].get(ac, 0) + 1
        if len(_s["modules"]) < 20 and type(module).__name__ not in _s["modules"]:
            _s["modules"].append(type(module).__name__)
        if core.opts.get("param_nonfinite") and len(_s["modules_seen"]) < 8:
            _s["modules_seen"].append(weakref.ref(module))
        _s["fwd_left"] -= 1
        if _s["fwd_left"] <= 0 and _s["fwd_handle"] is not None and not _s["pinned"]:
            _s["fwd_handle"].remove()
            _s["fwd_handle"] = None
    except Exception as e:
        core.record_error("forward hook", e)
    return None


def _watch_batches(module) -> None:
    """Fingerprint the inputs of the model's training forward calls (batches.py), with a hook on that module alone:
    every other module keeps its fast path. Moves to a new model when the root changes."""
    try:
        for key in ("batch_hook", "inner_batch_hook"):
            old = _s.pop(key, None)
            if old is not None:
                old.remove()
        _s["batch_hook"] = module.register_forward_pre_hook(_batch_hook, with_kwargs=True)
        inner = getattr(module, "module", None)  # DDP's or DataParallel's model, evaluated as `model.module`
        if type(module).__name__ in ("DistributedDataParallel", "DataParallel") \
                and isinstance(inner, sys.modules["torch"].nn.Module) and inner is not module:
            _s["inner_batch_hook"] = inner.register_forward_pre_hook(_inner_batch_hook, with_kwargs=True)
    except Exception as e:
        core.record_error("batch hook", e)


def _inner_batch_hook(module, args, kwargs):
    """The wrapped model's forward outside training (a DDP reference evaluating `model.module`): its inputs as
    evaluation inputs (batches.note_moments; the wrapper's own call, seen first, is not counted twice)."""
    if _IS_COMPILING[0]() or core.clock.in_step or not batches.wants_moments("eval"):
        return None
    try:
        torch = sys.modules["torch"]
        if module.training and not core.clock.eval and torch.is_grad_enabled():
            return None
        _eval_moments(_data_values(torch, args, kwargs))
    except Exception as e:
        core.record_error("batch hook", e)
    return None


def _data_values(torch, args, kwargs) -> list:
    """A forward call's tensors of at least batches.MIN_SIZE elements: its first 4 positional and 4 keyword values."""
    values = args[:4] if isinstance(args, tuple) else ()
    if kwargs:
        values = (*values, *list(kwargs.values())[:4])
    return [t for t in values if isinstance(t, torch.Tensor) and t.numel() >= batches.MIN_SIZE]


def _parts(data: list) -> list:
    """Each tensor's hashed bytes: a CPU tensor's own, a device tensor's host source's (None if not seen copied)."""
    return [batches.torch_part(t) if t.is_cpu else batches.copied_part(t) for t in data]


def _eval_moments(data: list, parts: list | None = None) -> None:
    """A forward call outside training: its tensors as evaluation inputs (batches.note_moments)."""
    batches.note_moments([batches.torch_host(t) for t in data], _parts(data) if parts is None else parts, "eval",
                         "forward", core.clock.step)


def _batch_hook(module, args, kwargs):
    if _IS_COMPILING[0]() or core.clock.in_step:
        return None
    try:
        torch = sys.modules["torch"]
        # not a training forward (an evaluation, or no_grad in train mode): looked at only right after an optimizer
        # step, for that step's batch given again (the loss of the updated weights, logged)
        training = module.training and not core.clock.eval and torch.is_grad_enabled()
        checking = not training and batches.checking_after(core.clock.step)
        if not training and not checking and not batches.wants_moments("eval"):
            return None
        data = _data_values(torch, args, kwargs)
        parts = _parts(data)
        if not training:
            if checking:
                batches.note_after(parts, core.clock.step)
            if batches.wants_moments("eval"):
                _eval_moments(data, parts)
            return None
        step = core.clock.step + 1  # before the step's optimizer.step ticks the clock
        batches.note_shapes(data, "torch forward", step)
        if not batches.full():
            batches.note(parts, "torch forward", step)
        if batches.wants_moments("train"):
            batches.note_moments([batches.torch_host(t) for t in data], parts, "train")
    except Exception as e:
        core.record_error("batch hook", e)
    return None


def _autocast_state() -> str:
    """The autocast regions a forward call runs in, as "cpu:bfloat16" (comma-joined; "off" for none): the
    precision the model computes in, which a port may change with one context manager."""
    import torch

    on = []
    for dev in ("cpu", "cuda", "xla"):
        try:
            if torch.is_autocast_enabled(dev):
                on.append(f"{dev}:{str(torch.get_autocast_dtype(dev)).replace('torch.', '')}")
        except Exception:  # a torch without the device-type API, or a device type it does not know
            continue
    return ",".join(on) or "off"


# ---------------------------------------------------------------- optimizer

def _param_names() -> dict:
    root = _s["root"]() if _s["root"] is not None else None
    if root is None:
        return {}
    try:
        return {id(p): n for n, p in root.named_parameters()}
    except Exception:
        return {}


def _group_record(group: dict, names: dict) -> dict:
    params = group.get("params", ())
    out = {k: core.jsonable(v) for k, v in group.items() if k not in _IMPL_KEYS}
    out["n_params"] = len(params)
    out["tensors"] = [[names.get(id(p)), list(getattr(p, "shape", ()))] for p in params[:2000]]
    return out


def _ignore() -> frozenset:
    return frozenset(["params", *core.opts.get("optimizer_ignore", ["lr", "initial_lr"])])


def _fingerprint(optimizer, getters: list):
    groups = optimizer.param_groups
    if len(groups) != len(getters):
        return None
    try:
        return [get(g) for get, g in zip(getters, groups)]
    except KeyError:
        return None


def _getters(optimizer) -> list:
    from operator import itemgetter

    ignore = _ignore()
    return [itemgetter(*sorted(k for k in g if k not in ignore)) for g in optimizer.param_groups]


def _optimizer_pre_hook(optimizer, args, kwargs):
    try:
        core.clock.in_step += 1
        if core.clock.source in core.Clock.FALLBACK and _s["clip"] is not None:
            _s["clip"]["step"] = 0  # the backward passes' clock is taken over below, from step 0
        step = core.clock.tick("torch optimizer.step")
        w = _s["window"]
        if w is not None and not _trains(w, optimizer):
            _close_window()  # an evaluation copy left in eval mode (a twin, an EMA model): evaluation ends here
            w = None
        if w is not None:  # a training step while a module is still in eval mode (model.train() not called back)
            ev = _s["steps_in_eval"]
            ev["steps"] += 1
            if ev["first"] is None:
                ev["first"], ev["module"] = step, w["module"]
        if core.grad_norms.owner not in (None, id(optimizer)) and id(optimizer) not in _s["optimizers"]:
            _take_over_norms(optimizer)
        if _grad_norms_on() and core.grad_norms.owner in (None, id(optimizer)):
            _grad_norm(optimizer, step)
        _note_stale_grad(optimizer, step)
        if step <= _DROPOUT_FIRST or (step % _DROPOUT_EVERY == 0 and _s["dropout"]["steps"] < _DROPOUT_MAX_STEPS):
            _note_dropout()
        if core.grad_norms.owner in (None, id(optimizer)):
            _keep_update_io(step)
        every = int(core.opts.get("sample_every", 50))
        if every > 0 and step % every == 0:
            _arm_forward_hook()
        key = id(optimizer)
        rec = _s["optimizers"].get(key)
        if rec is not None:
            record = rec["record"]
            record["last_step"] = step
            _note_no_grad(rec, optimizer)
            if not record["stateful"] and optimizer.state:  # dict size only: no tensor is read
                record["stateful"] = True
                record["state_dtypes"] = _state_dtypes(optimizer)
            _keep_lr(rec, optimizer, step)
            getters, last = rec["_cfg"]
            fp = _fingerprint(optimizer, getters)
            if fp is None or fp != last:
                getters = _getters(optimizer)
                rec["_cfg"] = (getters, _fingerprint(optimizer, getters))
                core.append(rec["record"]["changes"], {"step": step, "t": time.time(), "param_groups":
                                                       [{k: core.jsonable(v) for k, v in g.items() if k != "params"}
                                                        for g in optimizer.param_groups]})
            return
        cls = type(optimizer)
        names = _param_names()
        root = _s["root"]() if _s["root"] is not None else None
        if root is not None and not _s.get("module_types"):
            _s["module_types"] = sorted({type(m).__name__ for m in root.modules()})[:200]
        record = core.optimizer_record({
            "class": f"{cls.__module__}.{cls.__qualname__}", "name": cls.__name__, "framework": "torch",
            "first_step": step, "t": time.time(),
            "param_groups": [_group_record(g, names) for g in optimizer.param_groups],
            "group_sizes": [len(g.get("params", ())) for g in optimizer.param_groups],
            "clip": dict(_s["clip"]["config"]) if _s["clip"] else None, "changes": [],
            # an optimizer built again mid-run (a checkpoint resumed) either loaded its state or starts afresh:
            # how many parameters had state before its first step, and whether it ever held any
            "state_at_first_step": len(optimizer.state), "stateful": bool(optimizer.state), "last_step": step})
        if optimizer.state:
            record["state_dtypes"] = _state_dtypes(optimizer)
        getters = _getters(optimizer)
        sizes = record["group_sizes"]
        group = max(range(len(sizes)), key=lambda i: sizes[i]) if sizes else 0
        record["lr"] = {"source": "torch param_groups", "group": group, "values": []}
        _s["optimizers"][key] = rec = {"record": record, "_cfg": (getters, _fingerprint(optimizer, getters)),
                                       "_lr_group": group}
        _keep_lr(rec, optimizer, step)
        _note_no_grad(rec, optimizer, names)
    except Exception as e:
        core.record_error("optimizer hook", e)


def _state_dtypes(optimizer) -> dict:
    """The floating-point dtypes the optimizer keeps its state in (momentum, Adam's moments), dtype -> elements, once
    it holds state: a port that keeps the moments in bfloat16 to save memory changes every update. Attributes
    only; no tensor is read."""
    out: dict = {}
    try:
        for per_param in list(optimizer.state.values())[:4096]:
            for v in (per_param.values() if isinstance(per_param, dict) else ()):
                if getattr(v, "is_floating_point", None) is not None and v.is_floating_point() and v.dim() > 0:
                    d = str(v.dtype).replace("torch.", "")
                    out[d] = out.get(d, 0) + int(v.numel())
    except Exception as e:
        core.record_error("optimizer state dtypes", e)
    return out


def _note_no_grad(rec: dict, optimizer, names: dict | None = None) -> None:
    """The optimizer's parameters that reach its step with no gradient (.grad None) at every one of its first
    core.NO_GRAD_STEPS steps: torch optimizers skip them (no update, no decay), so they are not trained. An attribute
    test per parameter; no tensor is read."""
    try:
        record = rec["record"]
        if "_ng" not in rec:
            names = names if names is not None else _param_names()
            params = [p for g in optimizer.param_groups for p in g.get("params", ())]
            rec["_ng"] = {"refs": [weakref.ref(p) for p in params], "never": list(range(len(params))),
                          "meta": [[names.get(id(p)), list(p.shape), int(p.numel())] for p in params]}
            record["no_grad"] = {"steps": 0, "tensors": len(params), "values": sum(m[2] for m in rec["_ng"]["meta"]),
                                 "params": []}
        ng, out = rec["_ng"], record["no_grad"]
        if out["steps"] >= core.NO_GRAD_STEPS or not ng["never"]:
            return  # judged: the window is over, or every parameter has had a gradient
        refs = ng["refs"]
        ng["never"] = [i for i in ng["never"] if refs[i]() is None or refs[i]().grad is None]
        out["steps"] += 1
        out["params"] = [ng["meta"][i] for i in ng["never"][:200]]
        out["never_tensors"] = len(ng["never"])
        out["never_values"] = sum(ng["meta"][i][2] for i in ng["never"])
    except Exception as e:
        core.record_error("no-grad parameters", e)


def _shapes(groups) -> list:
    return [[list(getattr(p, "shape", ())) for p in g.get("params", ())] for g in groups]


def _take_over_norms(optimizer) -> None:
    """A new optimizer over parameters shaped as those of the one whose gradient norms are recorded, which has
    stopped stepping: the same optimizer built again (a checkpoint resumed). Its norms continue the curve."""
    old = _s["optimizers"].get(core.grad_norms.owner)
    if old is None or old["record"].get("last_step", 0) >= core.clock.step:
        return
    mine = _shapes(optimizer.param_groups)
    theirs = [[t[1] for t in g.get("tensors", [])] for g in old["record"]["param_groups"]]
    if mine == theirs:
        core.grad_norms.owner = None


def _wrap_zero_grad(cls) -> None:
    orig = cls.zero_grad
    if getattr(orig, "_ladder_wrapped", False):
        return

    @functools.wraps(orig)
    def zero_grad(self, *a, **k):
        _s["zeroed"] = True
        return orig(self, *a, **k)

    zero_grad._ladder_wrapped = True
    cls.zero_grad = zero_grad


def _note_stale_grad(optimizer, step: int) -> None:
    """Whether this step's gradient still holds the previous step's: the first parameter's .grad is the same
    tensor as at the previous step (a weak reference: the probe keeps it alive no longer than the program),
    written to since, and no zero_grad (of an optimizer or a module) ran in between. zero_grad() dropped from
    the loop adds every earlier gradient into each update; micro-batches accumulated between two steps and
    zeroed after the step are not affected. Reads no tensor value (metadata only: no device transfer)."""
    ref = _s["grad_ref"]  # (the optimizer's id, its first parameter with a gradient, that gradient, its version)
    mine = ref is not None and ref[0] == id(optimizer)
    param = ref[1]() if mine else None  # remembered: no search of the param groups at every step
    grad = param.grad if param is not None else None
    if grad is None:
        param = next((p for g in optimizer.param_groups for p in g["params"] if p.grad is not None), None)
        if param is None:
            return
        grad = param.grad
    same = mine and ref[2]() is grad
    if mine:
        st = _s["stale"]
        st["judged"] += 1
        if same and not _s["zeroed"] and grad._version != ref[3]:
            st["steps"] += 1
            if st["first"] is None:
                st["first"] = step
    _s["grad_ref"] = (ref[0], ref[1], ref[2], grad._version) if same else \
        (id(optimizer), weakref.ref(param), weakref.ref(grad), grad._version)
    _s["zeroed"] = False


def _wrap_scheduler(torch) -> None:
    """A learning-rate scheduler stepped before its optimizer's first step (scheduler.step() moved above
    optimizer.step() in the loop): the schedule's first value is skipped and every step runs at the next one's
    rate, a shift of one step that the rate comparison allows on purpose. Noted at the scheduler's first call
    after its constructor's own, from the probe's record of the optimizer's steps."""
    try:
        cls = torch.optim.lr_scheduler.LRScheduler
    except AttributeError:  # a torch older than the public base class
        return
    orig = cls.step
    if getattr(orig, "_ladder_wrapped", False):
        return

    @functools.wraps(orig)
    def step(self, *a, **k):
        try:
            if getattr(self, "_step_count", None) == 1 and id(getattr(self, "optimizer", None)) not in _s["optimizers"]:
                core.append(_s["schedule_first"], {"scheduler": type(self).__name__, "step": core.clock.step}, 20)
        except Exception as e:
            core.record_error("scheduler hook", e)
        return orig(self, *a, **k)

    step._ladder_wrapped = True
    cls.step = step


def _keep_lr(rec: dict, optimizer, step: int) -> None:
    """The learning rate this step runs at (the largest parameter group's), when it changed: a schedule's
    values as the program really applied them. A Python float; a tensor rate is not read (a host read)."""
    lr_rec = rec["record"]["lr"]
    if lr_rec.get("stopped"):
        return
    try:
        lr = optimizer.param_groups[rec["_lr_group"]]["lr"]
    except (IndexError, KeyError):
        return
    if not isinstance(lr, (int, float)):
        lr_rec["stopped"] = f"the rate is a {type(lr).__name__}, not read (a host read)"
        return
    values = lr_rec["values"]
    if values and values[-1][1] == lr:
        return
    if len(values) >= core.MAX_LR_CHANGES:
        lr_rec["stopped"] = f"more than {core.MAX_LR_CHANGES} changes: kept up to step {values[-1][0]}"
        return
    values.append([step, float(lr)])


def _optimizer_post_hook(optimizer, args, kwargs):
    core.clock.in_step = max(0, core.clock.in_step - 1)


# ---------------------------------------------------------------- gradient clipping, skipped steps

def wrap_clip() -> None:
    """torch.nn.utils.clip_grad_norm_, wherever the program looks it up. torch_xla replaces it with its own
    version when it is imported, so its hook calls this again."""
    import torch.nn.utils as nu
    import torch.nn.utils.clip_grad as cg

    for owner in (nu, cg):
        orig = getattr(owner, "clip_grad_norm_", None)
        if orig is not None and not getattr(orig, "_ladder_wrapped", False):
            owner.clip_grad_norm_ = _clip_wrapper(orig)


def _clip_wrapper(orig):
    def clip_grad_norm_(parameters, max_norm, norm_type=2.0, *args, **kwargs):
        torch = sys.modules.get("torch")
        if torch is not None and not isinstance(parameters, torch.Tensor):
            try:  # a generator is consumed here as the clip would consume it: its tensors can then be counted
                parameters = list(parameters)
            except TypeError:
                pass
        total = orig(parameters, max_norm, norm_type, *args, **kwargs)
        if not _compiling():
            try:
                _keep_clip_cover(parameters, torch)
                cfg = {"max_norm": float(max_norm), "norm_type": float(norm_type)}
                _s["clip"] = {"config": cfg, "norm": total, "step": core.clock.step}
                if core.grad_norms.clip is None:
                    core.grad_norms.clip = cfg
                _keep_clip_max(total)
            except Exception as e:
                core.record_error("clip hook", e)
        return total

    clip_grad_norm_._ladder_wrapped = True
    clip_grad_norm_.__wrapped__ = orig
    clip_grad_norm_.__doc__ = orig.__doc__
    return clip_grad_norm_


def _keep_clip_cover(parameters, torch) -> None:
    """How many parameter elements each clip call was given (shapes only: nothing is read), smallest and largest
    over the run: a clip handed an exhausted generator (`params = model.parameters()` consumed by the optimizer)
    clips nothing while its max_norm looks right."""
    ts = [parameters] if torch is not None and isinstance(parameters, torch.Tensor) else \
        parameters if isinstance(parameters, list) else []
    n = sum(int(t.numel()) for t in ts if hasattr(t, "numel"))
    c = _s["clip_cover"]
    c["calls"] += 1
    c["min_elements"] = n if c["min_elements"] is None else min(c["min_elements"], n)
    c["max_elements"] = n if c["max_elements"] is None else max(c["max_elements"], n)
    if n == 0 and c["first_empty"] is None:
        c["first_empty"] = core.clock.step


def _keep_clip_max(total) -> None:
    """The largest norm the clip received over every step, kept on the device (one maximum a step, no read):
    a clip the reference lacks that never bound computed nothing else. Not on XLA, where the added op would
    change the traced graph."""
    dev = getattr(total, "device", None)
    if dev is None or dev.type == "xla" or not _grad_norms_on():
        return
    torch = sys.modules["torch"]
    with torch.no_grad():
        t = total.detach().float()
        m = _s.get("clip_max")
        _s["clip_max"] = t.clone() if m is None else torch.maximum(m, t)
    _s["clip_calls"] = _s.get("clip_calls", 0) + 1
    if core.grad_norms.clip_seen is None:
        core.grad_norms.clip_seen = _clip_seen


def _clip_seen() -> dict | None:
    m = _s.get("clip_max")
    if m is None:
        return None
    v = float(m.cpu())  # read quietly at exit (GradNorms.snapshot)
    return {"max_pre_clip": v if math.isfinite(v) else repr(v), "calls": int(_s.get("clip_calls", 0))}


def _wrap_scaler(torch) -> None:
    try:
        from torch.amp.grad_scaler import GradScaler
    except Exception:
        return
    orig = GradScaler.step
    if getattr(orig, "_ladder_wrapped", False):
        return

    def step(self, optimizer, *args, **kwargs):
        before = (core.clock.source, core.clock.step)  # an optimizer step taking over the clock steps too
        out = orig(self, optimizer, *args, **kwargs)
        _s["scaler_steps"] += 1
        if (core.clock.source, core.clock.step) == before and getattr(self, "_enabled", True):
            # the scaler found inf/NaN gradients and did not call optimizer.step: a skipped step
            _s["scaler_skipped"] += 1
            core.clock.tick("torch optimizer.step")
        return out

    step._ladder_wrapped = True
    step.__wrapped__ = orig
    GradScaler.step = step


# ---------------------------------------------------------------- gradient norms
# The global L2 norms of the gradient the optimizer is handed and of the parameters it updates, at
# optimizer.step (so after any clipping or unscaling the program did first); with clip_grad_norm_ in the
# same step, the norm it returned (before clipping) too. Each point: [step, grad, param, pre-clip].

def _grad_norms_on() -> bool:
    return bool(core.opts.get("grad_norms", True))


def _due(step: int, xla: bool) -> bool:
    """Keep this step's norms? Every step, unless computing them would cost more than grad_norm_budget
    of the step time: then every k-th step, k = cost / (budget x step time). On XLA they are computed at
    every step whatever is kept (the graph must not change), so only the keeping thins."""
    now = time.perf_counter()
    last = _s["gn_t"]
    _s["gn_t"] = now
    if last is not None:
        dt = now - last
        _s["gn_interval"] = dt if _s["gn_interval"] is None else 0.8 * _s["gn_interval"] + 0.2 * dt
    budget = float(core.opts.get("grad_norm_budget", 0.02))
    cost, interval = _s["gn_cost"], _s["gn_interval"]
    k = 1
    if not xla and cost is not None and interval and budget > 0:
        k = max(1, math.ceil(cost / (budget * interval)))
        # Kept steps are the multiples of a power of two: runs thinned under different loads (k 19 in one, 30
        # in another) then share their steps exactly (every 32nd is in every 16th), and their curves compare
        # on real samples, not on interpolations of a noisy series sampled at other steps.
        k = 1 << (k - 1).bit_length()
    core.grad_norms.every = max(core.grad_norms.every, k)
    return step % k == 0


def _grad_norm(optimizer, step: int) -> None:
    if _compiling():
        return  # inside a traced step: tensor work here would enter the user's graph
    torch = sys.modules["torch"]
    gn = core.grad_norms
    params = [p for g in optimizer.param_groups for p in g["params"] if getattr(p, "grad", None) is not None]
    if not params:
        return
    grads = [p.grad for p in params]
    if any(g.is_sparse for g in grads):
        return
    dev = grads[0].device
    xla = dev.type == "xla"
    due = _due(step, xla)
    if not (due or xla) or len(gn.values) >= core.MAX_GRAD_NORMS:
        if not xla:
            return
    gn.owner, gn.source, gn.collect = id(optimizer), "torch optimizer.step", _collect
    t0 = time.perf_counter()
    n = len(params)
    clip = _s["clip"]
    pre = clip["norm"] if clip is not None and clip["step"] == step - 1 else None
    dot = None
    with torch.no_grad():
        if pre is not None:
            # <g, theta> where a clip ran this step: with the clip's norm it tells a decay added to the gradient by
            # hand after the clip (torch's coupled weight decay written out) from no decay (ladder.checks.l2)
            dot = sum((g.detach().float() * q.detach().float()).sum().to(dev) for g, q in zip(grads, params))
        if dev.type in ("cpu", "cuda") and all(t.device == dev for t in grads + params):
            # one fused kernel for all 2n norms on CUDA, then one reduction: [grad norm, param norm]
            norms = torch._foreach_norm(grads + params)
            if len({t.dtype for t in norms}) > 1:
                norms = [t.float() for t in norms]
            both = torch.linalg.vector_norm(torch.stack(norms).float().view(2, n), dim=1)
        else:  # XLA (basic ops only: nothing that could fall back to the CPU) or tensors on several devices
            both = torch.stack([torch.sqrt(sum((t.detach().float() ** 2).sum().to(dev) for t in ts))
                                for ts in (grads, params)])
    if xla:
        _s["xla_live"] = (both, dot)  # alive through this step's mark_step at every step: one graph, not two
    if due and len(gn.values) < core.MAX_GRAD_NORMS:
        gn.values.append((step, both, pre, dot))
    c = time.perf_counter() - t0
    if _s["gn_timed"]:  # the first call pays one-off set-up: not a per-step cost
        recent = _s["gn_recent"] = _s["gn_recent"][-4:] + [c]
        _s["gn_cost"] = sorted(recent)[len(recent) // 2]  # the median of the last 5: a hiccup passes
    _s["gn_timed"] = True


def _collect(values: list) -> list:
    torch = sys.modules.get("torch")
    out = []
    for step, both, pre, dot in values:
        g, p = (float(x) for x in both.detach().cpu().tolist())
        pv, dv = (float(x.detach().float().cpu()) if x is not None and hasattr(x, "detach") else None
                  for x in (pre, dot))
        out.append([step] + [x if x is None or math.isfinite(x) else repr(x) for x in (g, p, pv, dv)])
    del torch
    return out


# ---------------------------------------------------------------- torch.compile (dynamo)

def on_dynamo(dynamo) -> None:
    if _s.get("dynamo_done") or not _s.get("ready"):
        return  # torch's own hook sets this up once torch has finished importing
    _s["dynamo_done"] = True
    import logging
    import os

    import torch

    core.framework("torch._dynamo", core.report["frameworks"].get("torch", "?"))
    if not os.environ.get("TORCH_LOGS"):
        # set_logs replaces the whole logging config; the user set none, so nothing of theirs is lost.
        torch._logging.set_logs(recompiles=True, graph_breaks=True)
        silent = True
    else:
        silent = False
    for name, kind in (("torch._dynamo.guards.__recompiles", "recompiles"),
                       ("torch._dynamo.symbolic_convert.__graph_breaks", "graph_breaks")):
        lg = logging.getLogger(name)
        lg.addHandler(_dynamo_handler(kind))
        if silent:
            lg.propagate = False  # keep the user's stderr exactly as without the probe
    # Past config.recompile_limit dynamo stops compiling the function and runs it eagerly, with one
    # warning on this logger and no further recompile records: the probe keeps that warning.
    logging.getLogger("torch._dynamo.convert_frame").addHandler(_dynamo_handler("recompile_limit"))
    _skip_probe_frames()


def _skip_probe_frames() -> None:
    """Dynamo must never compile the probe's own functions as frames of their own. Torch's modules are outside
    dynamo's tracing on some versions, so a hook or wrapper they call inside a compiled region starts a frame that
    dynamo would compile (and recompile on a guard, counted as the program's). Marked here as skipped frames only:
    where dynamo inlines the call instead (other versions), it still does, and the hook's is_compiling() check
    leaves nothing in the graph. Every code object of every probe module, nested ones included."""
    try:
        from torch._dynamo.eval_frame import skip_code
    except Exception:  # a torch without it: nothing to do
        return
    seen = set()

    def codes(code):
        if id(code) in seen:
            return
        seen.add(id(code))
        yield code
        for c in code.co_consts:
            if hasattr(c, "co_code"):
                yield from codes(c)

    for name, mod in list(sys.modules.items()):
        if name != "_ladder_probe" and not name.startswith("_ladder_probe."):
            continue
        found = list(vars(mod).values())
        found += [f for v in found if isinstance(v, type) for f in vars(v).values()]
        for v in found:
            code = getattr(v, "__code__", None)
            if code is None:
                continue
            for c in codes(code):
                try:
                    skip_code(c)
                except Exception as e:
                    core.record_error("dynamo skip", e)
                    return


HOOKS["torch._dynamo"] = on_dynamo
_Handler = None


def _dynamo_handler(kind: str):
    global _Handler
    if _Handler is None:
        import logging

        class Handler(logging.Handler):
            def __init__(self, kind: str) -> None:
                super().__init__(level=logging.DEBUG)
                self.kind = kind

            def emit(self, record) -> None:
                try:
                    _dynamo_record(self.kind, record)
                except Exception as e:
                    core.record_error("dynamo log handler", e)

        _Handler = Handler
    return _Handler(kind)


def _dynamo_record(kind: str, record) -> None:
    msg = record.getMessage()
    lst = _s["dynamo"][kind]
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    if kind == "recompile_limit" and "hit config." not in msg:
        return
    item = {"t": record.created, "message": msg[:1500], "step": core.clock.step, "eval": core.clock.eval}
    if kind == "recompiles" and first.startswith("Recompiling function"):
        item["function"] = first.split("Recompiling function", 1)[1].strip().split(" in ")[0]
        reasons = [ln.strip()[2:] for ln in msg.splitlines() if ln.strip().startswith("- ")
                   and "User stack" not in ln and "File " not in ln]
        item["reason"] = reasons[0] if reasons else ""
    if kind == "recompile_limit":
        for ln in msg.splitlines():
            if ln.strip().startswith("function:"):
                item["function"] = ln.split(":", 1)[1].strip()
        item["reason"] = first
    if kind == "graph_breaks":
        for ln in msg.splitlines():
            if ln.startswith("Graph Break Reason:"):
                item["reason"] = ln.split(":", 1)[1].strip()
                break
        item["where"] = first
    core.append(lst, item)


def _snapshot_dynamo() -> dict | None:
    if "torch._dynamo" not in core.report["frameworks"]:
        return None
    utils = sys.modules.get("torch._dynamo.utils")
    counters = {}
    if utils is not None and hasattr(utils, "counters"):
        for k, v in utils.counters.items():
            try:
                counters[str(k)] = {str(kk)[:300]: int(vv) for kk, vv in dict(v).items()}
            except Exception:
                pass
    return {**_s["dynamo"], "counters": counters}


# ---------------------------------------------------------------- dropout layers

_DROPOUT_FIRST = 5  # optimizer steps whose model's dropout layers are all read, then every _DROPOUT_EVERY-th
_DROPOUT_EVERY = 25
_DROPOUT_MAX_STEPS = 40


def _note_dropout() -> None:
    """The dropout layers of the trained model (the outermost module) at an optimizer step: the rates of those in
    training mode ("on": they masked this step's forward) and of those in eval mode ("off"), rates above 0; the
    layers of rate 0 are counted apart. A module's flags are read, no tensor."""
    root = _s["root"]() if _s["root"] is not None else None
    torch = sys.modules.get("torch")
    if root is None or torch is None:
        return
    base = getattr(getattr(getattr(torch.nn, "modules", None), "dropout", None), "_DropoutNd", None)
    if base is None:
        return
    d = _s["dropout"]
    d["steps"] += 1
    layers = 0
    for m in root.modules():
        p = getattr(m, "p", None) if isinstance(m, base) else None
        if not isinstance(p, (int, float)):
            continue
        layers += 1
        if p <= 0:
            d["zero_rate"] = True
            continue
        side = d["on"] if m.training else d["off"]
        if round(float(p), 6) not in side:
            side.append(round(float(p), 6))
            side.sort()
    d["layers"] = max(d["layers"], layers)


# ---------------------------------------------------------------- activation checkpointing without the RNG state

_DROPOUT_FNS = ("dropout", "dropout1d", "dropout2d", "dropout3d", "alpha_dropout", "feature_alpha_dropout")


def _checkpoint_wrapper(orig):
    """A checkpointed call with `preserve_rng_state=False` recomputes its forward in the backward pass from the
    generators' state at that later time: dropout inside it draws other masks, so the gradient is not the one of the
    loss the forward computed. Only such calls are watched: while one runs, torch.nn.functional's dropout functions
    (which `nn.Dropout` calls) count the masks drawn in training, then are put back. Not while dynamo traces."""
    @functools.wraps(orig)
    def checkpoint(function, *args, **kwargs):
        if kwargs.get("preserve_rng_state", True) or _compiling():
            return orig(function, *args, **kwargs)
        ck = _s["ckpt"]
        ck["calls"] += 1
        F = sys.modules.get("torch.nn.functional")
        saved = {n: getattr(F, n) for n in _DROPOUT_FNS if F is not None and hasattr(F, n)} if ck["calls"] <= 64 else {}
        for n, f in saved.items():
            setattr(F, n, _counting_dropout(f))
        try:
            return orig(function, *args, **kwargs)
        finally:
            for n, f in saved.items():
                setattr(F, n, f)

    checkpoint._ladder_wrapped = True
    return checkpoint


def _counting_dropout(f):
    @functools.wraps(f)
    def dropout(input, *args, **kwargs):
        p = args[0] if args else kwargs.get("p", 0.5)
        training = args[1] if len(args) > 1 else kwargs.get("training", True)
        try:
            if training and float(p) > 0:
                _s["ckpt"]["dropout_calls"] += 1
        except (TypeError, ValueError):
            pass
        return f(input, *args, **kwargs)

    return dropout


# ---------------------------------------------------------------- exit

def _nonfinite_params() -> list | None:
    torch = sys.modules.get("torch")
    if torch is None or not core.opts.get("param_nonfinite"):
        return None
    bad = []
    with core.quiet():
        for ref in _s["modules_seen"]:
            m = ref()
            if m is None:
                continue
            for name, p in m.named_parameters():
                if not bool(torch.isfinite(p.detach()).all()):
                    bad.append(f"{type(m).__name__}.{name}")
    return sorted(set(bad))[:50]


def snapshot() -> dict:
    if "torch" not in core.report["frameworks"]:
        return {}
    _close_window()
    facts = {k: _s[k] for k in ("forward_samples", "param_devices", "param_dtypes", "autocast", "input_devices",
                                "first_seen", "last_step", "modules")}
    facts["module_types"] = _s.get("module_types") or []
    facts["input_dtypes"] = dict(_s["input_dtypes"])  # floating-point inputs of the sampled forward calls
    facts["h2d_dtypes"] = dict(_s["h2d_dtypes"])  # floating-point host tensors sent to a device, by arriving dtype
    facts["grad_scaler"] = {"steps": _s["scaler_steps"], "skipped": _s["scaler_skipped"]}
    facts["steps_in_eval_mode"] = dict(_s["steps_in_eval"])
    facts["stale_grad_steps"] = dict(_s["stale"])
    facts["schedule_before_step"] = list(_s["schedule_first"])
    facts["clip_coverage"] = dict(_s["clip_cover"])
    facts["dropout"] = dict(_s["dropout"])
    facts["checkpoint_no_rng"] = {k: _s["ckpt"][k] for k in ("calls", "dropout_calls")}
    out = {"torch": facts,
           "eval_windows": _s["eval_windows"], "dynamo": _snapshot_dynamo()}
    try:
        out["nonfinite_params"] = _nonfinite_params()
    except Exception as e:
        core.record_error("param check", e)
    try:
        samples = _update_samples()
        if samples is not None:
            out["update_samples"] = samples
    except Exception as e:
        core.record_error("update samples", e)
    return out
