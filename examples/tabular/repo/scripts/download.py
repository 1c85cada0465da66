"""Fetch the census-style table to data/raw/census.csv (generated here, so the example needs no network).

8,192 rows: age, hours per week, years of education, log income, six test scores, a work-class code
(0-3), and the label (1: the outcome happened), drawn from a fixed logistic model with a fixed seed.
"""

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


if __name__ == "__main__":
    os.makedirs("data/raw", exist_ok=True)
    header = "age,hours,education,log_income,s1,s2,s3,s4,s5,s6,workclass,label"
    np.savetxt("data/raw/census.csv", table(), delimiter=",", header=header, comments="", fmt="%.6f")
    print("downloaded data/raw/census.csv")
