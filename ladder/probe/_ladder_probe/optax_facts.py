"""optax facts: the optimizer as the program built it, and the gradient at the outermost transformation.

Every public optax constructor that returns a GradientTransformation is wrapped: the transformation it
returns carries a description (its function, its arguments, the transformations it was given) and an
update that knows how deep it is called. The outermost update (depth 0: the whole chain, the whole
multi_transform) is "the optimizer":
- one record per outermost transformation, its branches and masks resolved per parameter into groups of
  equal hyperparameters (name, betas, eps, weight decay and whether it is coupled or decoupled,
  momentum, nesterov), each group listing its parameters' paths and shapes, and the global-norm clip;
- the global norms of the gradient it receives (before any clipping in the chain, across every
  branch) and of the parameters, handed to jax_facts' context as the step's extra output.
Nothing is added to a step that jax_facts does not trace: an eager update records its norms directly.
"""

from __future__ import annotations

import functools
import math
import sys
import threading
from collections.abc import Mapping

import _ladder_probe as core
from _ladder_probe import jax_facts

SNAPSHOT_ORDER = 3
_tls = threading.local()
_desc: dict = {}  # id(transformation) -> its description
_alive: list = []  # the described transformations, kept so that their ids are never reused
_orig: dict = {}
_ALIASES = {"adam", "adamw", "sgd", "nadam", "nadamw", "rmsprop", "adagrad", "adafactor", "lamb", "lion", "lars",
            "adabelief", "radam", "adamax", "adamaxw", "noisy_sgd", "adadelta", "amsgrad", "novograd", "sm3", "yogi",
            "fromage", "adan", "polyak_sgd", "sign_sgd", "signum", "rprop", "lbfgs", "scale_by_adam"}
_DECOUPLED = {"adamw", "nadamw", "adamaxw", "lamb", "lion", "adan"}  # they take weight_decay themselves
_SCALERS = _ALIASES | {"scale_by_adam", "scale_by_rms", "scale_by_learning_rate", "scale", "trace", "scale_by_schedule"}
# where a transformation takes its step size: a number or a schedule (a function of the update count)
_LR_ARG = {"scale_by_learning_rate": "learning_rate", "scale_by_schedule": "step_size_fn", "scale": "step_size"}
_lr_sources: list = []  # (optimizer record, step size: number or schedule, injected?) for the exit


def reset() -> None:
    for d in _desc.values():
        d.pop("recorded", None)
        d.pop("record", None)
    _zero.clear()


def on_optax(optax) -> None:
    import inspect

    core.framework("optax", str(getattr(optax, "__version__", "?")))
    gt = getattr(optax, "GradientTransformation", None)
    if gt is None:
        return
    _orig["gt"] = gt
    _orig["global_norm"] = optax.global_norm
    apply = getattr(optax, "apply_updates", None)
    if apply is not None and not getattr(apply, "_ladder_wrapped", False):
        setattr(optax, "apply_updates", _wrap_apply(apply))
    for name in dir(optax):
        if name.startswith("_"):
            continue
        fn = getattr(optax, name, None)
        if inspect.isfunction(fn) and not getattr(fn, "_ladder_wrapped", False):
            setattr(optax, name, _wrap_ctor(name, fn))


HOOKS = {"optax": on_optax}


def _wrap_apply(fn):
    """optax.apply_updates: inside a traced training step, the parameters it returns are marked in the trace's box
    (jax_facts counts the matmuls that use them after the trace's last update: the loss of the updated weights). The
    result is unchanged."""
    @functools.wraps(fn)
    def apply_updates(params, updates, *args, **kwargs):
        out = fn(params, updates, *args, **kwargs)
        box = jax_facts.current_box()
        if box is not None and box.trace is not None:
            # the matmuls counted are those after the trace's last update: several steps unrolled in one call
            # compute each step's forward with the previous step's update, as training does
            box.after_matmuls = 0
            try:
                for x in sys.modules["jax"].tree_util.tree_leaves(out):
                    if getattr(x, "_trace", None) is box.trace:
                        box.updated[id(x)] = x
            except Exception as e:  # never into the program
                core.record_error("optax apply_updates", e)
        return out

    apply_updates._ladder_wrapped = True
    return apply_updates


def _wrap_ctor(name: str, fn):
    import inspect

    try:
        sig = inspect.signature(fn)
    except (TypeError, ValueError):
        sig = None

    def ctor(*args, **kwargs):
        tx = fn(*args, **kwargs)
        try:
            if isinstance(tx, _orig["gt"]):
                tx = _described(name, tx, sig, args, kwargs)
            elif name in _INJECTORS and callable(tx) and args:
                tx = _injected(tx, args[0])
        except Exception as e:
            core.record_error(f"optax {name}", e)
        return tx

    functools.update_wrapper(ctor, fn)
    ctor._ladder_wrapped = True
    return ctor


_INJECTORS = {"inject_hyperparams", "inject_stateful_hyperparams"}


def _injected(factory, inner):
    """inject_hyperparams(optax.sgd) returns a factory; the transformation it makes is described as the inner
    one with the arguments it was given (the inner is built again at init time, outside any chain)."""
    import inspect

    inner_name = getattr(inner, "__name__", "inject_hyperparams")
    try:
        inner_sig = inspect.signature(inner)
    except (TypeError, ValueError):
        inner_sig = None

    @functools.wraps(factory)
    def made(*args, **kwargs):
        tx = factory(*args, **kwargs)
        try:
            if isinstance(tx, _orig["gt"]):
                return _described(inner_name, tx, inner_sig, args, kwargs, injected=True)
        except Exception as e:
            core.record_error(f"optax inject_hyperparams({inner_name})", e)
        return tx

    return made


def _described(name: str, tx, sig, args, kwargs, injected: bool = False):
    desc: dict = {"fn": name, "args": {}, "children": [], "objects": {}, "injected": injected}
    bound = None
    if sig is not None:
        try:
            bound = sig.bind_partial(*args, **kwargs)
            bound.apply_defaults()
        except TypeError:
            bound = None
    items = list(bound.arguments.items()) if bound is not None else [(str(i), a) for i, a in enumerate(args)]
    for key, value in items:
        kids = _children(value, key)
        if kids:
            desc["children"] += kids
        elif callable(value) or (not isinstance(value, (int, float, str, bool, type(None), list, tuple))):
            desc["objects"][key] = value  # a schedule, a mask or label function, a mask or label pytree
            desc["args"][key] = "<schedule>" if key in ("learning_rate", "lr") and callable(value) else "<object>"
        else:
            desc["args"][key] = core.jsonable(value)
    new = tx._replace(update=_wrap_update(tx.update, desc))
    _desc[id(new)] = desc
    _alive.append(new)
    return new


def _children(value, key: str) -> list:
    if isinstance(value, _orig["gt"]) and id(value) in _desc:
        return [{"label": key, "desc": _desc[id(value)]}]
    out = []
    if isinstance(value, dict):
        for k, v in value.items():
            if isinstance(v, _orig["gt"]) and id(v) in _desc:
                out.append({"label": str(k), "desc": _desc[id(v)]})
    elif isinstance(value, (list, tuple)):
        for i, v in enumerate(value):
            if isinstance(v, tuple) and len(v) == 2 and isinstance(v[0], str):  # named_chain
                out += _children(v[1], v[0])
            else:
                out += _children(v, str(i))
    return out


def _wrap_update(update, desc: dict):
    def wrapped(updates, state, params=None, *args, **kwargs):
        depth = getattr(_tls, "depth", 0)
        if depth == 0:
            try:
                _outermost(desc, updates, params, state)
            except Exception as e:
                core.record_error("optax update", e)
        _tls.depth = depth + 1
        try:
            return update(updates, state, params, *args, **kwargs)
        finally:
            _tls.depth = depth

    return wrapped


def _state_measure(state):
    """How far the optimizer's state is from a fresh one: its step counts (Adam's, a schedule's), or, for a state
    without one, the global norm of its floating leaves (momentum). Zero at the first update; zero again later only
    when the state was built anew (a checkpoint restored without it). The counts alone where there are some: a few
    scalars, where a norm would read the whole state every step. None for a state with nothing to measure."""
    jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]
    counts: list = []
    _counts(state, counts, jnp, 0)
    if counts:
        return sum(jnp.sum(jnp.abs(c)).astype(jnp.float32) for c in counts)
    leaves = [x for x in jax.tree_util.tree_leaves(state) if hasattr(x, "dtype")]
    floats = [x for x in leaves if jnp.issubdtype(x.dtype, jnp.floating)]
    return _orig["global_norm"](floats) if floats else None


def _state_dtypes(state) -> dict:
    """The floating-point dtypes of the optimizer state's arrays (Adam's moments, momentum), dtype -> elements, as
    torch_facts records them: `optax.adam(mu_dtype=jnp.bfloat16)` keeps the first moment rounded. Shapes and dtypes
    of the traced state only."""
    jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]
    out: dict = {}
    for x in jax.tree_util.tree_leaves(state):
        if hasattr(x, "dtype") and getattr(x, "shape", ()) != () and jnp.issubdtype(x.dtype, jnp.floating):
            d = str(x.dtype)
            out[d] = out.get(d, 0) + int(math.prod(int(s) for s in x.shape))
    return out


# counters that go back to zero by design: apply_every's and MultiSteps' position within the accumulation
_CYCLING = {"ApplyEvery": "count", "MultiStepsState": "mini_step"}


def _counts(node, out: list, jnp, depth: int) -> None:
    """The integer leaves of an optax state that only grow (step counts), its cycling counters left out."""
    if depth > 32 or node is None:
        return
    if hasattr(node, "dtype") and hasattr(node, "shape"):
        if jnp.issubdtype(node.dtype, jnp.integer):
            out.append(node)
        return
    if isinstance(node, Mapping):  # a dict, flax's FrozenDict
        for v in node.values():
            _counts(v, out, jnp, depth + 1)
        return
    if isinstance(node, (tuple, list)):
        skip = _CYCLING.get(type(node).__name__) if hasattr(node, "_fields") else None
        for i, v in enumerate(node):
            if skip is None or node._fields[i] != skip:
                _counts(v, out, jnp, depth + 1)


_zero: dict = {}  # the leaves of the gradient whose zero flags go out with the norms: meta, and the optimizer record


def _zero_leaves(desc: dict, updates):
    """One flag per floating leaf of the gradient the optimizer receives: is it exactly zero everywhere? A
    parameter whose gradient a transformation cuts (jax.lax.stop_gradient, a frozen subtree closed over as a
    constant) gets zeros, not None as in torch: AdamW still decays it, nothing trains it. A compare and a
    reduction per leaf, beside the global norm the update already reads; the flags stay on the device until exit."""
    jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]
    flat, _ = jax.tree_util.tree_flatten_with_path(updates)
    leaves = [(path, x) for path, x in flat if hasattr(x, "dtype") and jnp.issubdtype(x.dtype, jnp.floating)]
    if not leaves:
        return None
    if not _zero and desc.get("record") is not None:
        meta = [[jax.tree_util.keystr(path), [int(d) for d in x.shape], math.prod(int(d) for d in x.shape)]
                for path, x in leaves]
        _zero.update(meta=meta, record=desc["record"])
    return jnp.stack([jnp.all(x == 0) for _, x in leaves])


def note_zero_gradients(rows: list) -> None:
    """The flags of the first core.NO_GRAD_STEPS recorded updates, read back at exit (jax_facts' collect): the leaves
    zero at every one of them go into the optimizer record's `no_grad`, in torch_facts' form, `test` saying how."""
    np = sys.modules.get("numpy")
    if not _zero or np is None:
        return
    meta = _zero["meta"]
    flags = []
    for _, v in sorted(rows, key=lambda r: r[0])[:core.NO_GRAD_STEPS]:
        v = np.asarray(v)
        v = v[0] if v.ndim == 2 else v  # pmap: one row per device, the gradients averaged across them
        if v.shape == (len(meta),):
            flags.append(v.astype(bool))
    if not flags:
        return
    never = [i for i in range(len(meta)) if all(f[i] for f in flags)]
    _zero["record"]["no_grad"] = {
        "steps": len(flags), "tensors": len(meta), "values": sum(m[2] for m in meta),
        "params": [meta[i] for i in never[:200]], "never_tensors": len(never),
        "never_values": sum(meta[i][2] for i in never), "test": "gradient exactly zero"}


def _outermost(desc: dict, updates, params, state=None) -> None:
    jax = sys.modules["jax"]
    if not desc.get("recorded"):
        desc["recorded"] = True
        _record(desc, params if params is not None else updates)
        if desc.get("record") is not None and state is not None:
            desc["record"]["state_dtypes"] = _state_dtypes(state)
    if not core.opts.get("grad_norms", True):
        box = jax_facts.current_box()
        if box is not None:
            box.update_seen = True
        elif not isinstance(jax.tree_util.tree_leaves(updates)[0], jax.core.Tracer):
            core.clock.tick("optax update")
        return
    gnorm = _orig["global_norm"]
    aux = (gnorm(updates), gnorm(params) if params is not None else None, _state_measure(state),
           _zero_leaves(desc, updates))
    box = jax_facts.current_box()
    if box is not None:
        box.offer(aux)
    elif not isinstance(aux[0], jax.core.Tracer):  # an eager update: one step, norms recorded directly
        core.clock.tick("optax update")
        jax_facts._keep(aux)
    elif core.grad_norms.why_missing is None:
        core.grad_norms.why_missing = "the optimizer update ran inside a transformation the probe does not wrap"


# ---------------------------------------------------------------- the optimizer record

def _settings(desc: dict, leaf: dict, out: dict, scaled: list, route: tuple = ()) -> None:
    """Walk a description for one parameter leaf (path, shape, label, index) and set what applies to it.
    `route`: the branches taken to get here (a multi_transform's label, a mask), which tell one call of a clip
    from another: a clip inside a branch measures the norm of that branch's parameters alone."""
    fn, args, objs = desc["fn"], desc["args"], desc["objects"]
    if fn in ("multi_transform", "partition"):
        label = _label_of(objs, leaf)
        for child in desc["children"]:
            if child["label"] == str(label):
                _settings(child["desc"], leaf, out, scaled, (*route, id(desc), str(label)))
        return
    if fn == "masked":
        if _mask_of(objs, "mask", leaf, default=True):
            for child in desc["children"]:
                _settings(child["desc"], leaf, out, scaled, (*route, id(desc)))
        return
    if fn in ("chain", "named_chain"):
        for child in desc["children"]:
            _settings(child["desc"], leaf, out, scaled, route)
        return
    if fn == "flatten":  # its inner transformation sees one 1-D vector: masks and labels are applied to that
        flat = {"params": _flat_stub(leaf), "index": 0, "cache": leaf["cache"].setdefault("flat", {})}
        for child in desc["children"]:
            _settings(child["desc"], flat, out, scaled, route)
        return
    for child in desc["children"]:  # wrappers (apply_if_finite, MultiSteps-like): their inner transformation
        _settings(child["desc"], leaf, out, scaled, route)
    if fn == "clip_by_global_norm":
        if scaled:  # after the optimizer's scaling or momentum: it clips the update, not the gradient
            out.setdefault("update_clip", args.get("max_norm"))
        else:
            out.setdefault("clip", args.get("max_norm"))
            out.setdefault("clip_calls", []).append((*route, id(desc)))
            if out.get("decay_mode") == "coupled":  # torch adds coupled decay inside the step, after clip_grad_norm_
                out["decay_mode"] = "coupled, clipped with the gradient"
    if fn == "set_to_zero" and "name" not in out:  # a multi_transform branch that freezes its parameters
        out["name"] = "set_to_zero"
    if fn == "add_decayed_weights":
        if _mask_of(objs, "mask", leaf, default=True) and args.get("weight_decay"):
            out["weight_decay"] = args.get("weight_decay")
            out["decay_mode"] = "decoupled" if scaled else "coupled"
    if fn in _ALIASES:
        out["name"] = "adam" if fn == "scale_by_adam" else fn
        if "b1" in args and "b2" in args:
            out["betas"] = [args["b1"], args["b2"]]
        for k in ("eps", "momentum", "nesterov", "decay", "initial_accumulator_value"):
            if k in args:
                out[k] = args[k]
        wd = args.get("weight_decay")
        if fn in _DECOUPLED and wd and _mask_of(objs, "mask", leaf, default=True):
            out["weight_decay"], out["decay_mode"] = wd, "decoupled"
    if fn == "trace" and "name" not in out and not any(f in _LR_ARG for f in scaled):
        # momentum before the step size, as torch's SGD: chain(trace(m), scale_by_learning_rate(lr)) is sgd(lr, m);
        # the step size inside the momentum buffer (scale first) is another optimizer and stays unnamed
        out["name"], out["momentum"], out["nesterov"] = "sgd", args.get("decay"), args.get("nesterov", False)
    if (fn in _ALIASES or fn in _LR_ARG) and "lr" not in out:
        key = _LR_ARG.get(fn, "learning_rate")
        src = objs.get(key, args.get(key))
        if src is not None:
            out["lr"], out["lr_injected"] = src, bool(desc.get("injected"))
    if fn in _SCALERS:
        scaled.append(fn)


def _flat_stub(leaf: dict):
    """What `optax.flatten` hands its inner transformation, in shape and dtype: the parameters raveled into one
    vector (a ShapeDtypeStruct: a mask or label function reads its `ndim` or `shape`, and nothing is allocated)."""
    cache = leaf["cache"]
    if "flat_stub" not in cache:
        jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]
        leaves = [x for x in jax.tree_util.tree_leaves(leaf["params"]) if hasattr(x, "shape")]
        size = sum(math.prod(int(d) for d in x.shape) for x in leaves)
        dtype = jnp.result_type(*[x.dtype for x in leaves]) if leaves else jnp.float32
        cache["flat_stub"] = jax.ShapeDtypeStruct((size,), dtype)
    return cache["flat_stub"]


def _label_of(objs: dict, leaf: dict):
    labels = objs.get("param_labels")
    if labels is None:
        return None
    tree = labels(leaf["params"]) if callable(labels) else labels
    return _leaf_value(tree, leaf)


def _mask_of(objs: dict, key: str, leaf: dict, default: bool) -> bool:
    mask = objs.get(key)
    if mask is None:
        return default
    tree = mask(leaf["params"]) if callable(mask) else mask
    v = _leaf_value(tree, leaf)
    return default if v is None else bool(v)


def _leaf_value(tree, leaf: dict):
    jax = sys.modules["jax"]
    key = id(tree)
    cache = leaf["cache"]
    if key not in cache:  # the tree is kept beside its leaves so that its id stays its own
        cache[key] = (tree, jax.tree_util.tree_leaves(tree, is_leaf=lambda x: x is None))
    values = cache[key][1]
    if len(values) == 1 and values[0] is tree:
        return tree  # one label or one flag for every parameter
    return values[leaf["index"]] if leaf["index"] < len(values) else None


def _record(desc: dict, params) -> None:
    jax = sys.modules["jax"]
    flat, _ = jax.tree_util.tree_flatten_with_path(params)
    cache: dict = {}
    groups: dict = {}
    rates: dict = {}
    clip = None
    cover: dict = {}  # one call of a clip (its route) -> the parameter elements it is given
    for i, (path, value) in enumerate(flat):
        leaf = {"params": params, "index": i, "cache": cache}
        out: dict = {}
        _settings(desc, leaf, out, [])
        clip = out.pop("clip", clip)
        for call in out.pop("clip_calls", []):
            size = 1
            for d in getattr(value, "shape", ()):
                size *= int(d)
            cover[call] = cover.get(call, 0) + size
        rate = (out.pop("lr", None), out.pop("lr_injected", False))
        out.setdefault("weight_decay", 0.0)
        key = repr(sorted(out.items()))
        rates.setdefault(key, rate)
        g = groups.setdefault(key, {**out, "n_params": 0, "tensors": []})
        g["n_params"] += 1
        if len(g["tensors"]) < 2000:
            g["tensors"].append([jax.tree_util.keystr(path), list(getattr(value, "shape", ()))])
    names = sorted({g.get("name") for g in groups.values() if g.get("name")})
    first_is_clip = bool(desc["fn"] in ("chain", "named_chain") and desc["children"]
                         and desc["children"][0]["desc"]["fn"] == "clip_by_global_norm")
    if clip is not None and core.grad_norms.clip is None:
        core.grad_norms.clip = {"max_norm": clip, "first": first_is_clip or desc["fn"] == "clip_by_global_norm"}
    record = core.optimizer_record({
        "class": f"optax.{desc['fn']}", "name": names[0] if len(names) == 1 else "+".join(names) or desc["fn"],
        "framework": "optax", "first_step": core.clock.step,
        "param_groups": list(groups.values()), "group_sizes": [g["n_params"] for g in groups.values()],
        "clip": {"max_norm": clip} if clip is not None else None, "structure": _public(desc), "changes": [],
        # as torch's clip_grad_norm_ calls are counted: the elements each clip's norm is taken over
        "clip_coverage": {"calls": len(cover), "min_elements": min(cover.values()),
                          "max_elements": max(cover.values())} if cover else None})
    desc["record"] = record
    if groups:
        biggest = max(groups, key=lambda k: groups[k]["n_params"])
        record["lr"] = {"source": "optax", "group": list(groups).index(biggest), "values": []}
        _lr_sources.append((record, *rates[biggest]))


def _public(desc: dict) -> dict:
    return {"fn": desc["fn"], "args": desc["args"],
            "children": [{"label": c["label"], **_public(c["desc"])} for c in desc["children"]]}


def snapshot() -> dict:
    for record, rate, injected in _lr_sources:
        try:
            _schedule_values(record["lr"], rate, injected)
        except Exception as e:
            record["lr"]["stopped"] = f"the schedule could not be evaluated: {type(e).__name__}: {e}"[:300]
    return {}


def _schedule_values(lr_rec: dict, rate, injected: bool) -> None:
    """The step size at each update, as a change log [[step, lr]] (step = update count + 1, the clock's step of
    that update), evaluated once at exit from the number or the schedule the optimizer was built with; the
    magnitude, as `scale(-lr)` and `scale_by_schedule(lambda c: -f(c))` carry the sign."""
    if rate is None:
        lr_rec["stopped"] = "no step size found in the optimizer's arguments"
        return
    if injected:
        lr_rec["stopped"] = ("inject_hyperparams: the rate lives in the optimizer state, where the program may "
                             "set it from the host; not read")
        return
    steps = max(core.clock.step, 1)
    if not callable(rate):
        lr_rec["values"] = [[1, abs(float(rate))]]
        return
    jax, jnp = sys.modules["jax"], sys.modules["jax.numpy"]
    counts = list(range(steps)) if steps <= core.MAX_LR_CHANGES else [
        round(i * (steps - 1) / (core.MAX_LR_CHANGES - 1)) for i in range(core.MAX_LR_CHANGES)]
    with core.quiet():
        try:
            vals = [abs(float(v)) for v in jax.device_get(rate(jnp.asarray(counts)))]
            if len(vals) != len(counts):
                raise ValueError("not elementwise")
        except Exception:  # a schedule with Python control flow: one count at a time
            vals = [abs(float(rate(c))) for c in counts]
    out: list = []
    for c, v in zip(counts, vals):
        if not out or out[-1][1] != v:
            out.append([c + 1, v])
    lr_rec["values"] = out
