"""The text corpus, copied from the reference repo so that both sides train on the same characters.

Sentences of pseudo-words: 400 words built from consonant-vowel syllables, drawn with Zipf
frequencies, a fixed seed.
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
