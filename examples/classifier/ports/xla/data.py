"""Synthetic 8-class classification data, generated with numpy only.

The data depend on DATA_SEED alone (never on the training seed), so every run,
and every framework a port uses, trains and evaluates on the same arrays.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

DATA_SEED = 20240607
N_CLASSES = 8
N_FEATURES = 32
N_TRAIN = 8192
N_TEST = 2048

_LATENT_DIM = 8
_CLUSTERS_PER_CLASS = 4
_CLUSTER_SPREAD = 1.0
_CLUSTER_NOISE = 0.6
_FEATURE_NOISE = 0.2
_LABEL_NOISE = 0.05
_OUTLIER_FRACTION = 0.015
_OUTLIER_SCALE = 6.0


def _random_rotation(rng: np.random.Generator, n: int) -> np.ndarray:
    q, r = np.linalg.qr(rng.normal(size=(n, n)))
    return q * np.sign(np.diag(r))


def make_dataset(
    seed: int = DATA_SEED,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (x_train, y_train, x_test, y_test); x float32, y int64.

    Each class is a few Gaussian clusters in an 8-d latent space, lifted to 32
    features through tanh between two random rotations, so no linear model
    separates it. Label noise (both splits) keeps the best accuracy clearly
    below 100%; outliers (train only) are far-away points with random labels.
    """
    rng = np.random.default_rng(seed)
    n = N_TRAIN + N_TEST
    centers = rng.normal(size=(N_CLASSES, _CLUSTERS_PER_CLASS, _LATENT_DIM)) * _CLUSTER_SPREAD
    labels = rng.integers(0, N_CLASSES, size=n)
    cluster = rng.integers(0, _CLUSTERS_PER_CLASS, size=n)
    z = centers[labels, cluster] + rng.normal(size=(n, _LATENT_DIM)) * _CLUSTER_NOISE

    lift = rng.normal(size=(_LATENT_DIM, N_FEATURES)) / np.sqrt(_LATENT_DIM)
    h = np.tanh(1.5 * z @ lift) @ _random_rotation(rng, N_FEATURES)
    x = np.tanh(h) @ _random_rotation(rng, N_FEATURES)
    x = x + rng.normal(size=x.shape) * _FEATURE_NOISE

    flip = rng.random(n) < _LABEL_NOISE
    labels[flip] = (labels[flip] + rng.integers(1, N_CLASSES, size=flip.sum())) % N_CLASSES

    x_train, y_train = x[:N_TRAIN], labels[:N_TRAIN]
    x_test, y_test = x[N_TRAIN:], labels[N_TRAIN:]

    outliers = rng.random(N_TRAIN) < _OUTLIER_FRACTION
    x_train[outliers] = rng.normal(size=(outliers.sum(), N_FEATURES)) * _OUTLIER_SCALE
    y_train[outliers] = rng.integers(0, N_CLASSES, size=outliers.sum())

    # Standardise with train statistics only, as a real pipeline would.
    mean, std = x_train.mean(axis=0), x_train.std(axis=0) + 1e-6
    x_train = (x_train - mean) / std
    x_test = (x_test - mean) / std
    return (
        x_train.astype(np.float32),
        y_train.astype(np.int64),
        x_test.astype(np.float32),
        y_test.astype(np.int64),
    )


def train_batches(
    x: np.ndarray, y: np.ndarray, batch_size: int, seed: int
) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Endless shuffled batches; a new permutation each epoch, last partial batch dropped."""
    rng = np.random.default_rng(seed)
    per_epoch = len(x) // batch_size
    while True:
        order = rng.permutation(len(x))
        for b in range(per_epoch):
            idx = order[b * batch_size : (b + 1) * batch_size]
            yield x[idx], y[idx]
