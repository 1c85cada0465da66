"""[probe] seed = true: a different seed per run for a program that seeds itself from a constant.

Each call of torch.manual_seed / torch.cuda.manual_seed(_all), numpy.random.seed / default_rng,
random.seed and jax.random.PRNGKey / jax.random.key gets `seed + offset`, where the offset comes from
LADDER_SEED (the run's seed, times a large prime); LADDER_SEED=0 leaves the program exactly as it is. torch's
default generator, which an unseeded program uses, is seeded with its default seed plus the offset when
torch is imported. Not patched: numpy.random.RandomState(seed) and torch.Generator().manual_seed(seed)
(their classes are compiled); the report lists what was called, so a program whose runs still come out
identical is named. A SeedSequence handed to default_rng counts by its entropy (the seed it was built from),
a list of ints by its elements; neither is offset.

Without the option the same functions are only watched: the values the program seeds them with (the first
few of each) go into the report, and L1 `randomness` asks whether the run's own seed reaches them.
"""

from __future__ import annotations

import functools
import os
import sys

import _ladder_probe as core

SNAPSHOT_ORDER = 4
_PRIME = 1_000_003
_TORCH_DEFAULT_SEED = 67280421310721
_s: dict = {"calls": {}, "patched": [], "values": {}}
_VALUES_KEPT = 8


def reset() -> None:
    _s["calls"] = {}
    _s["values"] = {}


def _offset() -> int:
    if not core.opts.get("seed"):
        return 0
    try:
        return int(os.environ.get("LADDER_SEED", "0")) * _PRIME
    except ValueError:
        return 0


def _seed_ints(seed, depth: int = 0) -> list:
    """The integers a seeding call's argument carries: an int (numpy's too), a sequence of ints (numpy takes
    [seed, rank]), or a numpy SeedSequence's entropy (default_rng(SeedSequence(seed).spawn(3)[0]))."""
    if seed is None or isinstance(seed, bool) or depth > 2:
        return []
    if isinstance(seed, int):
        return [seed]
    if type(seed).__module__.startswith("numpy") and hasattr(seed, "__index__") and not hasattr(seed, "entropy"):
        try:
            return [int(seed.__index__())]
        except Exception:
            return []
    entropy = getattr(seed, "entropy", None) if type(seed).__name__ == "SeedSequence" else None
    if entropy is not None:
        return _seed_ints(entropy, depth + 1)
    if isinstance(seed, (list, tuple)):
        return [i for x in seed[:_VALUES_KEPT] for i in _seed_ints(x, depth + 1)]
    return []


def _wrap(owner, attr: str, label: str, modulus: int | None) -> None:
    fn = getattr(owner, attr, None)
    if fn is None or getattr(fn, "_ladder_wrapped", False):
        return

    def seeded(seed=None, *args, **kwargs):
        _s["calls"][label] = _s["calls"].get(label, 0) + 1
        kept = _s["values"].setdefault(label, [])
        for v in _seed_ints(seed):  # as the program passed it: does the run's seed reach its generators?
            if len(kept) < _VALUES_KEPT and v not in kept:
                kept.append(v)
        if not kept:
            del _s["values"][label]
        if isinstance(seed, int) and not isinstance(seed, bool):
            seed = seed + _offset()
            if modulus:
                seed %= modulus
        return fn(seed, *args, **kwargs)

    try:
        functools.update_wrapper(seeded, fn)
    except Exception:
        pass
    seeded._ladder_wrapped = True
    setattr(owner, attr, seeded)
    _s["patched"].append(label)


def on_torch(torch) -> None:
    orig = torch.manual_seed
    for owner, attr, label in ((torch, "manual_seed", "torch.manual_seed"),
                               (torch.random, "manual_seed", "torch.random.manual_seed"),
                               (torch.cuda, "manual_seed", "torch.cuda.manual_seed"),
                               (torch.cuda, "manual_seed_all", "torch.cuda.manual_seed_all")):
        _wrap(owner, attr, label, 2 ** 63)
    if _offset():
        orig(_TORCH_DEFAULT_SEED + _offset())  # an unseeded program draws from the default generator


def on_numpy(np) -> None:
    _wrap(np.random, "seed", "numpy.random.seed", 2 ** 32)
    _wrap(np.random, "default_rng", "numpy.random.default_rng", None)


def on_random(random) -> None:
    _wrap(random, "seed", "random.seed", None)


def on_jax(jax) -> None:
    _wrap(jax.random, "PRNGKey", "jax.random.PRNGKey", 2 ** 32)
    _wrap(jax.random, "key", "jax.random.key", 2 ** 32)


HOOKS = {"torch": on_torch, "numpy": on_numpy, "random": on_random, "jax": on_jax}


def on_install() -> None:
    if "random" in sys.modules:  # imported before the probe (the interpreter's start-up may)
        on_random(sys.modules["random"])


def snapshot() -> dict:
    return {"seed": {"mode": bool(core.opts.get("seed")), "offset": _offset(), "patched": _s["patched"],
                     "calls": _s["calls"], "values": _s["values"]}}
