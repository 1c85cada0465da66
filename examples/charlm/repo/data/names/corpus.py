"""The text corpus: what `prepare.py` would download, generated here so the example needs no network.

Sentences of pseudo-words: 400 words built from consonant-vowel syllables, drawn with Zipf
frequencies, a fixed seed: text with structure a small model learns in a few hundred steps,
identical on every machine.
"""

import random

CONSONANTS = "bcdfghjklmnprstvwz"
VOWELS = "aeiou"
N_WORDS = 400
N_CHARS = 120_000


def corpus(n_chars: int = N_CHARS, seed: int = 42) -> str:
    rng = random.Random(seed)
    words = ["".join(rng.choice(CONSONANTS) + rng.choice(VOWELS) for _ in range(rng.randint(1, 3)))
             for _ in range(N_WORDS)]
    weights = [1.0 / (rank + 1) for rank in range(N_WORDS)]
    out, length = [], 0
    while length < n_chars:
        sentence = " ".join(rng.choices(words, weights=weights, k=rng.randint(3, 9))) + ".\n"
        out.append(sentence)
        length += len(sentence)
    return "".join(out)[:n_chars]
