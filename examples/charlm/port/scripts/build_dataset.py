"""Build the character data set as numpy arrays: train.npy, val.npy (int32, 90/10 split) and vocab.json.

    python scripts/build_dataset.py --out data
"""

import argparse
import json
import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import corpus  # noqa: E402

p = argparse.ArgumentParser(description=__doc__)
p.add_argument("--out", required=True, help="directory to write the arrays to")
args = p.parse_args()
text = corpus()
vocab = sorted(set(text))
index = {ch: i for i, ch in enumerate(vocab)}
ids = np.array([index[c] for c in text], dtype=np.int32)
split = int(len(ids) * 0.9)
os.makedirs(args.out, exist_ok=True)
np.save(os.path.join(args.out, "train.npy"), ids[:split])
np.save(os.path.join(args.out, "val.npy"), ids[split:])
with open(os.path.join(args.out, "vocab.json"), "w") as f:
    json.dump(vocab, f)
print(f"wrote {split} train and {len(ids) - split} val tokens, vocabulary of {len(vocab)}, to {args.out}")
