"""A small grain-style input pipeline (no grain dependency): data source -> sampler -> map -> batch.

- ArraySource: random access to records {"x": features (16,), "y": target ()} of the raw splits.
- Normalize: a MapTransform holding standardisation statistics, fitted once with Normalize.fit on the
  rows it is given (mean and population std per feature, float64, as numpy's defaults); map() scales a
  record's features and casts the record to float32.
- IndexSampler: the record order of one pass, a fresh np.random.permutation per pass when shuffling
  (the global numpy RNG, seeded by the program) or 0..n-1 in order.
- Batch: stacks records into arrays, x (B, 16) and y (B, 1); drop_remainder drops a last short batch.
- DataLoader: iterating it makes one pass (one epoch) over the source.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass

import numpy as np

Record = dict[str, np.ndarray]


@dataclass(frozen=True)
class ArraySource:
    x: np.ndarray
    y: np.ndarray

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int) -> Record:
        return {"x": self.x[index], "y": self.y[index]}


@dataclass(frozen=True)
class Normalize:
    mean: np.ndarray
    std: np.ndarray

    @classmethod
    def fit(cls, x: np.ndarray) -> "Normalize":
        return cls(mean=x.mean(axis=0), std=x.std(axis=0))

    def map(self, record: Record) -> Record:
        return {"x": ((record["x"] - self.mean) / self.std).astype(np.float32),
                "y": np.asarray(record["y"], dtype=np.float32)}


@dataclass(frozen=True)
class IndexSampler:
    num_records: int
    shuffle: bool

    def __iter__(self) -> Iterator[int]:
        order = np.random.permutation(self.num_records) if self.shuffle else np.arange(self.num_records)
        return iter(order.tolist())


@dataclass(frozen=True)
class Batch:
    batch_size: int
    drop_remainder: bool

    def __call__(self, records: Iterator[Record]) -> Iterator[Record]:
        buf: list[Record] = []
        for record in records:
            buf.append(record)
            if len(buf) == self.batch_size:
                yield self._stack(buf)
                buf = []
        if buf and not self.drop_remainder:
            yield self._stack(buf)

    @staticmethod
    def _stack(records: Sequence[Record]) -> Record:
        return {"x": np.stack([r["x"] for r in records]),
                "y": np.stack([r["y"] for r in records]).reshape(-1, 1)}


@dataclass(frozen=True)
class DataLoader:
    source: ArraySource
    sampler: IndexSampler
    transform: Normalize
    batch: Batch

    def __iter__(self) -> Iterator[Record]:
        records = (self.transform.map(self.source[i]) for i in self.sampler)
        return self.batch(records)

    def __len__(self) -> int:
        n = len(self.source) // self.batch.batch_size
        return n if self.batch.drop_remainder or len(self.source) % self.batch.batch_size == 0 else n + 1
