"""A synthetic character corpus, generated with numpy only from a small random grammar.

The text depends on DATA_SEED alone (never on the training seed), so every run, and
every framework a port uses, trains and evaluates on the same characters.

Sentences follow a tiny English-like grammar with structure a small transformer can
learn: subject-verb number agreement ("the red cat sees" / "the red cats see"),
optional adjectives and prepositional phrases, relative clauses whose verb agrees
with the noun they follow, and conjunctions. Words are drawn with Zipf-like
frequencies, so the character loss falls well below uniform but not to zero.
"""

from __future__ import annotations

import bisect

import numpy as np

DATA_SEED = 1729
N_SENTENCES = 9000
VAL_FRACTION = 0.1

_DETS = ["the", "a", "every", "one", "this", "that", "my", "our"]
_PLURAL_DETS = ["the", "some", "many", "two", "these", "those", "my", "our"]
_ADJS = ["red", "big", "small", "old", "quiet", "happy", "green", "clever", "lazy", "bright", "dark", "tiny"]
_NOUNS = ["cat", "dog", "bird", "fox", "king", "queen", "robot", "child", "farmer", "horse", "wizard",
          "sailor", "teacher", "baker", "river", "garden", "tower", "forest"]
_PLURAL = {"child": "children", "fox": "foxes", "wizard": "wizards"}
_VERBS = ["see", "like", "follow", "help", "watch", "find", "chase", "know", "visit", "guard", "paint", "call"]
_VERB_3SG = {"watch": "watches"}
_PREPS = ["near", "under", "behind", "beside", "above", "with"]
_INTRANS = ["sleep", "run", "sing", "wait", "smile", "dance"]


class _Draws:
    """Uniform draws from one numpy Generator, taken in bulk (a Python-level draw per word is slow)."""

    def __init__(self, seed: int, chunk: int = 1 << 16) -> None:
        self._rng = np.random.default_rng(seed)
        self._chunk = chunk
        self._buf: list[float] = []

    def random(self) -> float:
        if not self._buf:
            self._buf = self._rng.random(self._chunk).tolist()[::-1]
        return self._buf.pop()


_CDF_CACHE: dict[int, list[float]] = {}


def _zipf_cdf(n: int) -> list[float]:
    if n not in _CDF_CACHE:
        w = 1.0 / np.arange(1, n + 1)
        _CDF_CACHE[n] = np.cumsum(w / w.sum()).tolist()
    return _CDF_CACHE[n]


def _pick(rng: _Draws, cdf: list[float]) -> int:
    return min(bisect.bisect_right(cdf, rng.random()), len(cdf) - 1)


def _zipf(rng: _Draws, items: list[str]) -> str:
    return items[_pick(rng, _zipf_cdf(len(items)))]


def _plural(noun: str) -> str:
    return _PLURAL.get(noun, noun + "s")


def _verb(verb: str, singular: bool) -> str:
    return _VERB_3SG.get(verb, verb + "s") if singular else verb


def _noun_phrase(rng: _Draws, depth: int) -> tuple[str, bool]:
    singular = rng.random() < 0.6
    det = _zipf(rng, _DETS if singular else _PLURAL_DETS)
    words = [det]
    for _ in range(_pick(rng, [0.5, 0.85, 1.0])):
        words.append(_zipf(rng, _ADJS))
    noun = _zipf(rng, _NOUNS)
    words.append(noun if singular else _plural(noun))
    if depth < 2 and rng.random() < 0.2:
        obj, _ = _noun_phrase(rng, depth + 1)
        words += ["that", _verb(_zipf(rng, _VERBS), singular), obj]
    elif depth < 2 and rng.random() < 0.2:
        obj, _ = _noun_phrase(rng, depth + 1)
        words += [_zipf(rng, _PREPS), obj]
    return " ".join(words), singular


def _clause(rng: _Draws) -> str:
    subj, singular = _noun_phrase(rng, 0)
    if rng.random() < 0.25:
        return f"{subj} {_verb(_zipf(rng, _INTRANS), singular)}"
    obj, _ = _noun_phrase(rng, 1)
    return f"{subj} {_verb(_zipf(rng, _VERBS), singular)} {obj}"


def make_text(seed: int = DATA_SEED, n_sentences: int = N_SENTENCES) -> str:
    rng = _Draws(seed)
    sentences = []
    for _ in range(n_sentences):
        s = _clause(rng)
        if rng.random() < 0.2:
            s += " and " + _clause(rng)
        sentences.append(s + ".")
    return "\n".join(sentences) + "\n"


def make_dataset(seed: int = DATA_SEED) -> tuple[np.ndarray, np.ndarray, list[str]]:
    """Return (train_ids, val_ids, vocab): int64 character ids; the last VAL_FRACTION of the text is val."""
    text = make_text(seed)
    vocab = sorted(set(text))
    lookup = {c: i for i, c in enumerate(vocab)}
    ids = np.array([lookup[c] for c in text], dtype=np.int64)
    n_val = int(len(ids) * VAL_FRACTION)
    return ids[:-n_val], ids[-n_val:], vocab
