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
few of each) go into the report, and L1 `randomness` asks whether the run's own seed reaches them. A call with
no seed made by the program's own code (`np.random.default_rng()`, `random.seed()`: OS entropy) is reported
with its site (`unseeded`), as is a draw from numpy's or random's global generator (`np.random.permutation`,
`random.shuffle`) made by the program's own code while that generator was never seeded in the process
(`global_draws`); for numpy's, random's and torch's global generators the report also says whether the run
drew from them at all (`drew`). A DataLoader that shuffles with a `torch.Generator()` never seeded draws the same
order at every seed (`constant`).

A seed a port derives (`PRNGKey(seed + 1)`, `default_rng(seed * 1000 + epoch)`) has another value than the run's
seed, yet comes from it. So the seed flag is followed: when the program parses its arguments with argparse, an
int option whose name holds "seed" and whose value is the run's seed (LADDER_SEED) becomes a `_FromSeed`, an int
of the same value, hash and comparisons whose arithmetic with ints gives `_FromSeed` again. A seeding call that
receives one (or a list or SeedSequence holding one) is reported as reached by the run's seed (`from_seed`).
`int(x)`, `str(x)` and pickling give plain ints, so a seed that passes through them is judged by its value alone.
"""

from __future__ import annotations

import functools
import os
import sys

import _ladder_probe as core

SNAPSHOT_ORDER = 4
_PRIME = 1_000_003
_TORCH_DEFAULT_SEED = 67280421310721
_s: dict = {"calls": {}, "patched": [], "values": {}, "from_seed": {}, "flag": None, "states": {}, "unseeded": {},
            "global_draws": {}, "constant": {}, "before_seed": {}}
# the global generators seeded in this process (kept across a fork: a forked child inherits the seeded state)
_SEEDED: set = set()
_VALUES_KEPT = 8


def reset() -> None:
    _s["calls"] = {}
    _s["values"] = {}
    _s["from_seed"] = {}
    _s["states"] = {}
    _s["unseeded"] = {}
    _s["global_draws"] = {}
    _s["constant"] = {}
    _s["before_seed"] = {}


try:
    import sysconfig

    _STDLIB = sysconfig.get_paths().get("stdlib") or ""
except Exception:  # never into the program
    _STDLIB = ""


def _program_site(frame) -> str | None:
    """`file:line` of a call made by the program's own code; None for a library's (site-packages, the standard
    library, the probe), whose calls without a seed are its business, not the port's."""
    name = frame.f_code.co_filename if frame is not None else "<?>"
    if name.startswith("<") or any(part in name for part in ("site-packages", "dist-packages", "_ladder_probe")):
        return None
    if _STDLIB and name.startswith(_STDLIB):
        return None
    return f"{name.rsplit('/', 1)[-1]}:{frame.f_lineno}"


# The global host generators a seeding call sets, and how to read a fingerprint of their state without drawing:
# a generator whose state at exit is the one it had when first seen (or last seeded) drew nothing, so leaving it
# unseeded changes nothing (a port that draws its data order from a torch generator, never from numpy's).
def _state_of(label: str):
    try:
        if label == "numpy.random.seed":
            st = sys.modules["numpy"].random.get_state()
            return hash((st[1].tobytes(), int(st[2])))
        if label == "random.seed":
            return hash(sys.modules["random"].getstate())
        if label == "torch.manual_seed":
            return hash(bytes(sys.modules["torch"].default_generator.get_state().numpy()))
    except Exception:  # a generator that cannot be read: whether it drew stays unknown
        return None
    return None


_GENERATORS = ("numpy.random.seed", "random.seed", "torch.manual_seed")


def _generator(label: str) -> str:
    """The global generator a seeding call's label names (torch.random.manual_seed is torch.manual_seed's)."""
    return label.replace("torch.random.", "torch.")


def _mark(label: str) -> None:
    """The generator's state now: when the probe first sees it and after each seeding call."""
    label = _generator(label)
    if label in _GENERATORS:
        with core.quiet():
            _s["states"][label] = _state_of(label)


def _drew_before_seed(label: str, frame) -> None:
    """A global generator's first seeding in this process: whether it drew since the probe first saw it (the
    program built its model, or drew anything, before seeding). Those draws follow no seed: torch starts its
    default generator from a seed of its own at import, new in every run here."""
    label = _generator(label)
    if label not in _GENERATORS or label in _s["before_seed"] or any(_generator(s) == label for s in _SEEDED):
        return
    before = _s["states"].get(label)
    if before is None:
        return
    with core.quiet():
        now = _state_of(label)
    if now is not None and now != before:
        _s["before_seed"][label] = _program_site(frame) or "a library"


class _FromSeed(int):
    """The run's seed as the program's seed option holds it: the same int, which stays a _FromSeed through
    integer arithmetic, so a value derived from the seed can be told from a constant where it seeds a
    generator. It pickles as a plain int (a child process or a checkpoint never needs the probe)."""

    __slots__ = ()

    def __reduce__(self):
        return (int, (int(self),))


def _lifted(name: str):
    op = getattr(int, name)

    def lifted(self, *args):
        out = op(self, *args)
        return _FromSeed(out) if type(out) is int else out

    lifted.__name__ = name
    return lifted


for _name in ("__add__", "__radd__", "__sub__", "__rsub__", "__mul__", "__rmul__", "__floordiv__",
              "__rfloordiv__", "__mod__", "__rmod__", "__pow__", "__rpow__", "__lshift__", "__rlshift__",
              "__rshift__", "__rrshift__", "__and__", "__rand__", "__or__", "__ror__", "__xor__", "__rxor__",
              "__neg__", "__pos__", "__abs__", "__invert__"):
    setattr(_FromSeed, _name, _lifted(_name))


def _carries_seed(seed, depth: int = 0) -> bool:
    if isinstance(seed, _FromSeed):
        return True
    if depth > 2:
        return False
    if type(seed).__name__ == "SeedSequence":
        return _carries_seed(getattr(seed, "entropy", None), depth + 1)
    if isinstance(seed, (list, tuple)):
        return any(_carries_seed(x, depth + 1) for x in seed[:_VALUES_KEPT])
    return False


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
        if seed is None and not label.startswith(("torch", "jax")):  # numpy's or random's, from OS entropy
            _SEEDED.discard(label)
            site = _program_site(sys._getframe(1))
            if site is not None:
                u = _s["unseeded"].setdefault(label, {"calls": 0, "site": site})
                u["calls"] += 1
        elif seed is not None:
            _drew_before_seed(label, sys._getframe(1))
            _SEEDED.add(label)
        kept = _s["values"].setdefault(label, [])
        for v in _seed_ints(seed):  # as the program passed it: does the run's seed reach its generators?
            if len(kept) < _VALUES_KEPT and v not in kept:
                kept.append(int(v))
        if not kept:
            del _s["values"][label]
        if _carries_seed(seed):
            _s["from_seed"][label] = _s["from_seed"].get(label, 0) + 1
        if isinstance(seed, int) and not isinstance(seed, bool):
            seed = seed + _offset()
            if modulus:
                seed %= modulus
        out = fn(seed, *args, **kwargs)
        _mark(label)
        return out

    core.replace(owner, attr, seeded, fn)
    _s["patched"].append(label)


# The module-level draws of numpy's and random's global generators. A draw made by the program's own code while
# the generator was never seeded in this process is counted with its site (`global_draws`): numbers no seed
# controls. Libraries draw at import (jax's k8s cluster module calls np.random.rand): theirs are left out.
_NUMPY_DRAWS = ("beta", "binomial", "bytes", "chisquare", "choice", "dirichlet", "exponential", "gamma", "geometric",
                "gumbel", "laplace", "logistic", "lognormal", "multinomial", "multivariate_normal", "normal",
                "permutation", "poisson", "rand", "randint", "randn", "random", "random_integers", "random_sample",
                "ranf", "sample", "shuffle", "standard_normal", "standard_t", "uniform")
_RANDOM_DRAWS = ("random", "uniform", "randint", "randrange", "choice", "choices", "shuffle", "sample", "gauss",
                 "normalvariate", "getrandbits", "betavariate", "expovariate", "triangular")


def _watch_draws(owner, names: tuple, label: str) -> None:
    for name in names:
        fn = getattr(owner, name, None)
        if fn is None or getattr(fn, "_ladder_wrapped", False):
            continue

        def draw(*args, _fn=fn, _name=name, **kwargs):
            if label not in _SEEDED:
                try:
                    site = _program_site(sys._getframe(1))
                    if site is not None:
                        d = _s["global_draws"].setdefault(label, {"calls": 0, "site": site, "first": _name})
                        d["calls"] += 1
                except Exception as e:  # never into the program
                    core.record_error("global draw", e)
            return _fn(*args, **kwargs)

        core.replace(owner, name, draw, fn)


# torch's functions that draw a data order (a permutation, indices, a weighted sample); their generator= argument
# is keyword-only. Only these: a wrapper stands where TorchScript and dynamo look for torch's own function (it is
# registered as TorchScript's builtin for the op, and dynamo inlines it: its check folds away while compiling), and
# sampling code inside a model is theirs, while a data order is drawn outside it
_ORDER_DRAWS = ("randperm", "randint", "multinomial")


def _watch_generator_draws(torch) -> None:
    """A data order drawn with torch.randperm/randint/multinomial from a `torch.Generator()` the program made and
    never seeded, outside an evaluation: it starts from torch's fixed default seed whatever torch.manual_seed said,
    so every run at every seed draws the same order (`constant`, as note_loader's DataLoader generator). The
    default generator is not judged here (torch.manual_seed seeds it; the seeding checks cover it)."""
    default = torch.default_generator
    compiling = getattr(getattr(torch, "compiler", None), "is_compiling", None) or (lambda: False)
    for name in _ORDER_DRAWS:
        fn = getattr(torch, name, None)
        if fn is None or getattr(fn, "_ladder_wrapped", False):
            continue

        def draw(*args, _fn=fn, _name=name, **kwargs):
            g = kwargs.get("generator")
            if g is not None and g is not default and not compiling():
                _note_generator(g, f"torch.{_name}", sys._getframe(1))
            return _fn(*args, **kwargs)

        core.replace(torch, name, draw, fn)
        try:  # TorchScript knows torch's builtins by identity: the wrapper compiles as the op it stands for
            from torch.jit._builtins import _register_builtin

            _register_builtin(draw, "aten::" + name)
        except Exception as e:  # a torch without it: scripting a function that draws would fail; say so
            core.record_error("torchscript builtin", e)


def _note_generator(gen, what: str, frame) -> None:
    try:
        if core.clock.eval or str(getattr(gen, "device", "cpu")) != "cpu" or gen.initial_seed() != _TORCH_DEFAULT_SEED:
            return
        while frame is not None and _program_site(frame) is None:
            frame = frame.f_back
        c = _s["constant"].setdefault("torch.Generator", {"calls": 0, "site": _program_site(frame) or "?",
                                                          "sampler": what})
        c["calls"] += 1
    except Exception as e:  # never into the program
        core.record_error("generator draw", e)


def on_torch(torch) -> None:
    _watch_generator_draws(torch)
    orig = torch.manual_seed
    for owner, attr, label in ((torch, "manual_seed", "torch.manual_seed"),
                               (torch.random, "manual_seed", "torch.random.manual_seed"),
                               (torch.cuda, "manual_seed", "torch.cuda.manual_seed"),
                               (torch.cuda, "manual_seed_all", "torch.cuda.manual_seed_all")):
        _wrap(owner, attr, label, 2 ** 63)
    if _offset():
        orig(_TORCH_DEFAULT_SEED + _offset())  # an unseeded program draws from the default generator
    _mark("torch.manual_seed")


def on_numpy(np) -> None:
    _wrap(np.random, "seed", "numpy.random.seed", 2 ** 32)
    _wrap(np.random, "default_rng", "numpy.random.default_rng", None)
    _watch_draws(np.random, _NUMPY_DRAWS, "numpy.random.seed")
    _mark("numpy.random.seed")


def on_random(random) -> None:
    _wrap(random, "seed", "random.seed", None)
    _watch_draws(random, _RANDOM_DRAWS, "random.seed")
    _mark("random.seed")


def on_jax(jax) -> None:
    _wrap(jax.random, "PRNGKey", "jax.random.PRNGKey", 2 ** 32)
    _wrap(jax.random, "key", "jax.random.key", 2 ** 32)


def on_argparse(argparse) -> None:
    cls = argparse.ArgumentParser
    fn = cls.parse_known_args
    if getattr(fn, "_ladder_wrapped", False):
        return
    try:
        run_seed = int(os.environ["LADDER_SEED"])
    except (KeyError, ValueError):
        return

    def parse_known_args(self, *args, **kwargs):
        out = fn(self, *args, **kwargs)
        try:
            namespace = out[0]
            for name, value in list(vars(namespace).items()):
                if "seed" in name.lower() and type(value) is int and value == run_seed:
                    setattr(namespace, name, _FromSeed(value))
                    _s["flag"] = name
        except Exception as e:  # never into the program
            core.record_error("seed flag", e)
        return out

    functools.update_wrapper(parse_known_args, fn)
    parse_known_args._ladder_wrapped = True
    cls.parse_known_args = parse_known_args


def on_yaml(yaml) -> None:
    """A program that saves its options with yaml.safe_dump must not meet an int it cannot represent."""
    for name in ("SafeDumper", "Dumper", "CSafeDumper", "CDumper"):
        dumper = getattr(yaml, name, None)
        if dumper is not None:
            dumper.add_representer(_FromSeed, lambda d, v: d.represent_int(int(v)))


def note_loader(loader, frame) -> None:
    """A DataLoader whose sampler shuffles with a torch.Generator the program made and never seeded: a new
    Generator starts from torch's fixed default seed whatever torch.manual_seed said, so the data order it draws
    is the same in every run at every seed (`constant`). Read when an iterator starts (each epoch) outside an
    evaluation (the order an evaluation averages over does not matter); a generator left None draws its seed from
    torch's default generator, which follows the seed."""
    if core.clock.eval:
        return
    sampler = getattr(loader, "sampler", None)
    for s in (sampler, getattr(getattr(loader, "batch_sampler", None), "sampler", None)):
        gen = getattr(s, "generator", None)
        if gen is None or not hasattr(gen, "initial_seed"):
            continue
        _note_generator(gen, f"a DataLoader's {type(s).__name__}", frame)
        return


HOOKS = {"torch": on_torch, "numpy": on_numpy, "random": on_random, "jax": on_jax, "argparse": on_argparse,
         "yaml": on_yaml}


def on_install() -> None:
    for name in ("random", "argparse"):  # imported before the probe (the interpreter's start-up may)
        if name in sys.modules:
            HOOKS[name](sys.modules[name])


def snapshot() -> dict:
    drew = {}
    with core.quiet():  # the probe's own reads of the states are not the program's
        for label, before in _s["states"].items():  # drew since seen or seeded: the state moved
            now = _state_of(label)
            if before is not None and now is not None:
                drew[label] = now != before
    for label, module in zip(_GENERATORS, ("numpy", "random", "torch")):
        if module not in sys.modules:  # never imported: never drawn from
            drew[label] = False
    return {"seed": {"mode": bool(core.opts.get("seed")), "offset": _offset(), "patched": _s["patched"],
                     "calls": _s["calls"], "values": _s["values"], "from_seed": _s["from_seed"],
                     "flag": _s["flag"], "drew": drew, "unseeded": _s["unseeded"],
                     "global_draws": _s["global_draws"], "constant": _s["constant"],
                     "before_seed": _s["before_seed"]}}
