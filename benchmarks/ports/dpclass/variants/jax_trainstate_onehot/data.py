"""Synthetic 16x16 grey-scale images of 8 pattern classes, generated with numpy only.

The images depend on DATA_SEED alone (never on the training seed), so every run and every
port trains and evaluates on the same arrays. Classes:
  0-3  stripes at 0, 45, 90 and 135 degrees (orientation jittered, random frequency and phase)
  4    a Gaussian blob          5  a ring
  6    a checkerboard           7  a plus-shaped cross
Each image gets a random contrast, a random background level and heavy pixel noise;
a few labels (both splits) are flipped, so the best accuracy stays clearly below 100%.
"""

from __future__ import annotations

import numpy as np

DATA_SEED = 20240917
N_CLASSES = 8
IMAGE_SIZE = 16
N_TRAIN = 4096
N_TEST = 1024

_ORIENTATION_JITTER = np.deg2rad(16.0)
_NOISE_RANGE = (0.5, 1.0)
_CONTRAST_RANGE = (0.5, 1.0)
_LABEL_NOISE = 0.04


def _patterns(rng: np.random.Generator, labels: np.ndarray) -> np.ndarray:
    n = len(labels)
    s = IMAGE_SIZE
    yy, xx = np.meshgrid(np.arange(s, dtype=np.float64), np.arange(s, dtype=np.float64), indexing="ij")
    yy, xx = yy[None], xx[None]
    out = np.zeros((n, s, s))

    # stripes: classes 0..3
    angle = (labels % 4) * (np.pi / 4) + rng.uniform(-1, 1, n) * _ORIENTATION_JITTER
    freq = rng.uniform(1.5, 3.5, n) * 2 * np.pi / s
    phase = rng.uniform(0, 2 * np.pi, n)
    proj = np.cos(angle)[:, None, None] * yy + np.sin(angle)[:, None, None] * xx
    stripes = np.sin(freq[:, None, None] * proj + phase[:, None, None])

    cy = rng.uniform(4, s - 4, n)[:, None, None]
    cx = rng.uniform(4, s - 4, n)[:, None, None]
    r2 = (yy - cy) ** 2 + (xx - cx) ** 2
    width = rng.uniform(1.5, 3.0, n)[:, None, None]
    blob = 2.0 * np.exp(-r2 / (2 * width**2)) - 0.5
    radius = rng.uniform(3.0, 5.5, n)[:, None, None]
    ring = 2.0 * np.exp(-((np.sqrt(r2) - radius) ** 2) / 1.5) - 0.5
    cell = rng.integers(2, 5, n)[:, None, None]
    checker = np.where(((yy + cy.round()) // cell + (xx + cx.round()) // cell) % 2 == 0, 1.0, -1.0)
    arm = rng.uniform(0.8, 1.8, n)[:, None, None]
    cross = np.where((np.abs(yy - cy) < arm) | (np.abs(xx - cx) < arm), 1.5, -0.5)

    out = np.where(labels[:, None, None] < 4, stripes, out)
    out = np.where(labels[:, None, None] == 4, blob, out)
    out = np.where(labels[:, None, None] == 5, ring, out)
    out = np.where(labels[:, None, None] == 6, checker, out)
    out = np.where(labels[:, None, None] == 7, cross, out)
    return out


def make_dataset(seed: int = DATA_SEED) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Return (x_train, y_train, x_test, y_test); x float32 of shape (N, 1, 16, 16), y int64."""
    rng = np.random.default_rng(seed)
    n = N_TRAIN + N_TEST
    labels = rng.integers(0, N_CLASSES, size=n)
    img = _patterns(rng, labels)
    contrast = rng.uniform(*_CONTRAST_RANGE, n)[:, None, None]
    background = rng.normal(0.0, 0.3, n)[:, None, None]
    noise = rng.uniform(*_NOISE_RANGE, n)[:, None, None]
    img = contrast * img + background + noise * rng.normal(size=img.shape)

    flip = rng.random(n) < _LABEL_NOISE
    labels[flip] = (labels[flip] + rng.integers(1, N_CLASSES, size=flip.sum())) % N_CLASSES

    x = img[:, None].astype(np.float32)
    mean, std = x[:N_TRAIN].mean(), x[:N_TRAIN].std()
    x = (x - mean) / std
    return x[:N_TRAIN], labels[:N_TRAIN].astype(np.int64), x[N_TRAIN:], labels[N_TRAIN:].astype(np.int64)
