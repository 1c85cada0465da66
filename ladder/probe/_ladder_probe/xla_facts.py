"""PyTorch/XLA facts: the metrics report (aten:: counters, compile and execute counts, transfers) and the
times of every compilation, read once at exit before torch_xla's own exit handlers clear them."""

from __future__ import annotations

import sys

import _ladder_probe as core

SNAPSHOT_ORDER = 0  # before anything reads a value back: that would move the counters
_COUNTERS = ("UncachedCompile", "CachedCompile", "MarkStep", "ExecuteComputation", "ExecuteReplicated")


def reset() -> None:
    pass


def on_torch_xla(torch_xla) -> None:
    import atexit

    core.framework("torch_xla", str(getattr(torch_xla, "__version__", "?")))
    from _ladder_probe import torch_facts

    torch_facts.wrap_clip()  # torch_xla has just put its own clip_grad_norm_ in place
    _wrap_host_to_device(torch_xla)
    # torch_xla registered its exit handler while importing; ours, registered now, runs before it.
    atexit.register(core.finalise)


HOOKS = {"torch_xla": on_torch_xla}


def _wrap_host_to_device(torch_xla) -> None:
    """MpDeviceLoader / ParallelLoader (and xm.send_cpu_data_to_device) copy host batches to the device through
    `_XLAC._xla_tensors_from_aten`, not `Tensor.to`: each copy is remembered with its host source's fingerprint
    (batches.py), for the model's forward call that takes it."""
    from _ladder_probe import batches

    xlac = getattr(torch_xla, "_XLAC", None)
    orig = getattr(xlac, "_xla_tensors_from_aten", None)
    if orig is None or getattr(orig, "_ladder_wrapped", False):
        return

    def _xla_tensors_from_aten(tensors, *args, **kwargs):
        out = orig(tensors, *args, **kwargs)
        if batches.full() and not batches.wants_moments():
            return out
        try:
            for src, dst in zip(tensors, out):
                batches.remember_copy(dst, batches.torch_part(src))
                if src.is_floating_point() and src.dim() >= 2:
                    batches.remember_host(dst, batches.torch_host(src))
        except Exception as e:  # never into the program
            core.record_error("xla transfer fingerprint", e)
        return out

    _xla_tensors_from_aten._ladder_wrapped = True
    _xla_tensors_from_aten.__wrapped__ = orig
    try:
        xlac._xla_tensors_from_aten = _xla_tensors_from_aten
    except Exception as e:
        core.record_error("xla transfer hook", e)


def _metric(met, name: str, keep: int) -> dict | None:
    if name not in met.metric_names():
        return None
    total, acc, samples = met.metric_data(name)
    return {"count": int(total), "total": float(acc),
            "samples": [[float(t), float(v)] for t, v in list(samples)[:keep]]}


def snapshot() -> dict:
    if "torch_xla" not in sys.modules or "torch_xla" not in core.report["frameworks"]:
        return {}
    import torch_xla.debug.metrics as met

    x: dict = {}
    counters = {}
    for name in met.counter_names():
        if name.startswith("aten::") or name in _COUNTERS:
            counters[name] = int(met.counter_value(name))
    x["counters"] = counters
    x["aten"] = {k: v for k, v in counters.items() if k.startswith("aten::")}
    for key, name in (("compile", "CompileTime"), ("execute", "ExecuteTime"),
                      ("execute_replicated", "ExecuteReplicatedTime"),
                      ("transfer_from_device", "TransferFromDeviceTime"),
                      ("transfer_to_device", "TransferToDeviceTime")):
        # only compile times are mapped to steps: keep all of them (bounded), a few of the others
        m = _metric(met, name, core.MAX_EVENTS if key == "compile" else 50)
        if m is not None:
            x[key] = m
    try:
        import torch_xla.runtime as xr

        x["device_type"] = xr.device_type()
        if x.get("execute") or x.get("compile"):  # the runtime is up; asking does not start it
            x["device_count"] = int(xr.global_runtime_device_count())
    except Exception as e:
        core.record_error("xla runtime facts", e)
    return {"xla": x}
