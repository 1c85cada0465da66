"""Build the feature arrays in one go: the census table (the same generator as the reference's download
script), split 4096 / 1024 / 3072, numeric columns standardised with the training split's statistics,
the work class one-hot.

    python tools/make_features.py --out features
"""

import argparse
import os

import numpy as np

N_ROWS = 8192


def table(seed: int = 2024) -> np.ndarray:
    rng = np.random.default_rng(seed)
    age = rng.uniform(18, 80, N_ROWS)
    hours = np.clip(rng.normal(40, 10, N_ROWS), 5, 90)
    edu = rng.integers(6, 21, N_ROWS).astype(float)
    log_income = rng.normal(10.5, 0.6, N_ROWS)
    scores = rng.normal(0, 1, (N_ROWS, 6)) @ rng.normal(0, 0.5, (6, 6))
    work = rng.integers(0, 4, N_ROWS).astype(float)
    z = (0.04 * (age - 45) + 0.05 * (hours - 40) + 0.25 * (edu - 13) + 1.2 * (log_income - 10.5)
         + scores @ np.array([0.8, -0.6, 0.5, 0.0, 0.3, -0.4]) + np.array([-0.5, 0.2, 0.4, -0.1])[work.astype(int)]
         + 0.6 * np.sin(scores[:, 0] * scores[:, 1]))
    label = (rng.random(N_ROWS) < 1 / (1 + np.exp(-z))).astype(float)
    return np.column_stack([age, hours, edu, log_income, scores, work, label])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--out", required=True, help="directory for {train,val,test}_{x,y}.npy")
    out = p.parse_args().out
    # the reference writes the table as CSV with 6 decimals and reads it back: round the same way
    raw = np.round(table(), 6)
    numeric, work, label = raw[:, :10], raw[:, 10].astype(int), raw[:, 11]
    features = np.concatenate([numeric, np.eye(4)[work]], axis=1)
    mean, std = numeric[:4096].mean(0), numeric[:4096].std(0)
    features[:, :10] = (numeric - mean) / std
    os.makedirs(out, exist_ok=True)
    for name, rows in (("train", slice(0, 4096)), ("val", slice(4096, 5120)), ("test", slice(5120, None))):
        np.save(os.path.join(out, f"{name}_x.npy"), features[rows].astype(np.float32))
        np.save(os.path.join(out, f"{name}_y.npy"), label[rows].astype(np.float32))
    print(f"features written to {out}")


if __name__ == "__main__":
    main()
