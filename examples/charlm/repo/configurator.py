"""Overrides the globals of train.py from the command line: `python train.py --max_iters=300`.

exec'd by train.py (the nanoGPT habit): every `--key=value` must name an existing global; the value
is parsed as a Python literal when it is one, else kept as a string.
"""

import sys
from ast import literal_eval

for arg in sys.argv[1:]:
    if not arg.startswith("--") or "=" not in arg:
        raise SystemExit(f"unknown argument {arg!r}: use --key=value")
    key, val = arg[2:].split("=", 1)
    if key not in globals():
        raise SystemExit(f"Unknown config key: {key}")
    try:
        attempt = literal_eval(val)
    except (SyntaxError, ValueError):
        attempt = val
    if type(attempt) is not type(globals()[key]) and not (isinstance(attempt, int) and isinstance(globals()[key], float)):
        raise SystemExit(f"config key {key} expects {type(globals()[key]).__name__}, got {val!r}")
    print(f"Overriding: {key} = {attempt}")
    globals()[key] = attempt
