"""ladder's injected probe: runs at interpreter start-up because ladder puts this directory first on
PYTHONPATH. It installs the probe (see _ladder_probe/), then runs the sitecustomize it shadows so
the user's environment behaves as before. Standard library only; it must never raise.
"""

import os as _os
import sys as _sys

_HERE = _os.path.dirname(_os.path.abspath(__file__))

try:
    if _HERE not in _sys.path:
        _sys.path.insert(0, _HERE)
    import _ladder_probe

    _ladder_probe.install()
except Exception:  # the user's program must run even if the probe cannot
    _ladder_probe = None


def _run_shadowed() -> None:
    # The next sitecustomize on sys.path after ours (a venv's, a distro's) would never run otherwise.
    import importlib.machinery

    here = os_path_real(_HERE)
    rest = [p for p in _sys.path if os_path_real(p) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", rest)
    if spec is None or spec.loader is None:
        return
    import importlib.util

    module = importlib.util.module_from_spec(spec)
    _sys.modules["_ladder_shadowed_sitecustomize"] = module
    spec.loader.exec_module(module)


def os_path_real(p: str) -> str:
    try:
        return _os.path.realpath(p or ".")
    except Exception:
        return p


try:
    _run_shadowed()
except Exception as _e:
    if _ladder_probe is not None:
        _ladder_probe.record_error("shadowed sitecustomize", _e)
    raise  # site.py reports it exactly as it would without the probe
