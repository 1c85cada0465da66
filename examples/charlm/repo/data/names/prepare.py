"""Prepare the character data set: fetch the corpus, map characters to integers, write train.bin,
val.bin (uint16, 90/10 split) and meta.json (the vocabulary) next to this file.

    python data/names/prepare.py
"""

import json
import os

import numpy as np

from corpus import corpus

here = os.path.dirname(os.path.abspath(__file__))
data = corpus()
print(f"length of dataset in characters: {len(data):,}")
chars = sorted(set(data))
stoi = {ch: i for i, ch in enumerate(chars)}
print(f"vocab size: {len(chars)}")
n = len(data)
train_ids = np.array([stoi[c] for c in data[: int(n * 0.9)]], dtype=np.uint16)
val_ids = np.array([stoi[c] for c in data[int(n * 0.9):]], dtype=np.uint16)
print(f"train has {len(train_ids):,} tokens")
print(f"val has {len(val_ids):,} tokens")
train_ids.tofile(os.path.join(here, "train.bin"))
val_ids.tofile(os.path.join(here, "val.bin"))
with open(os.path.join(here, "meta.json"), "w") as f:
    json.dump({"vocab_size": len(chars), "chars": chars}, f)
