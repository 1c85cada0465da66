"""Synthetic tabular regression data, generated with numpy only.

The arrays depend on DATA_SEED alone, through their own PCG64 generator (never
the global numpy or torch RNG), so every run and every framework sees the same
train and test sets. The target is a smooth nonlinear function of 16 features
plus heavy-tailed Student-t noise; about 1% of the TRAIN targets are gross
outliers (a recording error of +-5 to 10 units). The test set has the same
noise but no outliers.
"""

from __future__ import annotations

import numpy as np

DATA_SEED = 20240917
N_FEATURES = 16
N_TRAIN = 12800
N_TEST = 2048

_N_HIDDEN_UNITS = 8
_NOISE_SCALE = 0.3
_NOISE_DF = 3.0
_OUTLIER_FRACTION = 0.01
_OUTLIER_SCALE = 5.0


def make_dataset() -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (x_train, y_train, x_test, y_test): float32, x of shape (n, 16), y of shape (n, 1)."""
    rng = np.random.Generator(np.random.PCG64(DATA_SEED))
    n = N_TRAIN + N_TEST
    x = rng.normal(size=(n, N_FEATURES))
    w1 = rng.normal(size=(N_FEATURES, _N_HIDDEN_UNITS)) / np.sqrt(N_FEATURES)
    w2 = rng.normal(size=_N_HIDDEN_UNITS)
    f = np.tanh(1.5 * x @ w1) @ w2 + 0.5 * np.sin(2.0 * x[:, 0]) + 0.3 * x[:, 1] * x[:, 2]
    f = (f - f.mean()) / f.std()
    y = f + _NOISE_SCALE * rng.standard_t(_NOISE_DF, size=n)

    x_train, y_train = x[:N_TRAIN], y[:N_TRAIN].copy()
    x_test, y_test = x[N_TRAIN:], y[N_TRAIN:]
    outliers = rng.random(N_TRAIN) < _OUTLIER_FRACTION
    signs = rng.choice([-1.0, 1.0], size=outliers.sum())
    y_train[outliers] += signs * _OUTLIER_SCALE * (1.0 + rng.random(outliers.sum()))

    # Standardise the features with train statistics only, as a real pipeline would.
    mean, std = x_train.mean(axis=0), x_train.std(axis=0)
    x_train = (x_train - mean) / std
    x_test = (x_test - mean) / std
    return (
        x_train.astype(np.float32),
        y_train.reshape(-1, 1).astype(np.float32),
        x_test.astype(np.float32),
        y_test.reshape(-1, 1).astype(np.float32),
    )
