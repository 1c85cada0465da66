"""Double-buffered host-to-device input pipeline (the CUDA data_prefetcher recipe).

DevicePrefetcher wraps a DataLoader. Each pass (one epoch) starts a fresh
iterator over the loader, so the shuffle is drawn exactly when a plain
`for xb, yb in loader` would draw it. While the step on batch i runs, the copy
of batch i+1 to the device has already been issued: the batch handed out is
the one loaded on the previous call, and the next one is loaded before
returning.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.utils.data import DataLoader

Batch = tuple[torch.Tensor, torch.Tensor]


class DevicePrefetcher:
    def __init__(self, loader: DataLoader, device: Any) -> None:
        self.loader = loader
        self.device = device
        self._it: Any = None
        self._batch: Batch | None = None
        self._exhausted = True

    def __len__(self) -> int:
        return len(self.loader)

    def __iter__(self) -> "DevicePrefetcher":
        self._it = iter(self.loader)  # a new pass: the loader reshuffles here
        self._exhausted = False
        self._preload()
        return self

    def _preload(self) -> None:
        """Issue the copy of the loader's next batch to the device (kept in self._batch)."""
        try:
            xb, yb = next(self._it)
        except StopIteration:
            self._exhausted = True
            return
        self._batch = (xb.to(self.device), yb.to(self.device))

    def __next__(self) -> Batch:
        if self._exhausted:
            raise StopIteration
        batch = self._batch  # loaded on the previous call
        self._preload()  # start the next copy before the step runs
        assert batch is not None
        return batch
