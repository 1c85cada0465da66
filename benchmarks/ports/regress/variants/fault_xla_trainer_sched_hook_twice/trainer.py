"""A small Trainer with callbacks, grown out of the port's training loop.

The Trainer owns the step (transfer, zero_grad, forward, backward,
optimizer.step) and the step counter; everything around the step is a
callback with hooks on_train_start / on_step_end / on_train_end:
learning-rate scheduling, logging and evaluation. The step's loss is
added to a device-side MetricsCollection (read back only when a callback asks
for it); torch_xla.sync() then cuts and runs the step's graph, and the hooks
run after it.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Sequence

import torch
import torch_xla
from torch import nn


class MetricsCollection:
    """Named running means kept on the device: update() adds, compute() reads once per metric."""

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._sums: dict[str, torch.Tensor] = {}
        self._counts: dict[str, int] = {}

    def update(self, **values: torch.Tensor) -> None:
        for name, value in values.items():
            total = self._sums.get(name, torch.zeros((), device=self.device))
            self._sums[name] = total + value.detach()
            self._counts[name] = self._counts.get(name, 0) + 1

    def compute(self) -> dict[str, float]:
        return {name: total.item() / self._counts[name] for name, total in self._sums.items()}

    def reset(self) -> None:
        self._sums.clear()
        self._counts.clear()


class Callback:
    def on_train_start(self, trainer: "Trainer") -> None:
        pass

    def on_step_end(self, trainer: "Trainer", loss: torch.Tensor) -> None:
        pass

    def on_train_end(self, trainer: "Trainer") -> None:
        pass


class Trainer:
    def __init__(
        self,
        model: nn.Module,
        optimizer: torch.optim.Optimizer,
        criterion: Callable[[torch.Tensor, torch.Tensor], torch.Tensor],
        device: torch.device,
        max_steps: int,
        callbacks: Sequence[Callback] = (),
        scheduler: torch.optim.lr_scheduler.LRScheduler | None = None,
    ) -> None:
        self.model = model
        self.optimizer = optimizer
        self.criterion = criterion
        self.device = device
        self.max_steps = max_steps
        self.callbacks = list(callbacks)
        self.scheduler = scheduler  # stepped by the Trainer after every optimiser step when given
        self.metrics = MetricsCollection(device)
        self.step = 0
        self.results: dict[str, float] = {}

    def _hook(self, name: str, *args: object) -> None:
        for callback in self.callbacks:
            getattr(callback, name)(self, *args)

    def training_step(self, xb: torch.Tensor, yb: torch.Tensor) -> torch.Tensor:
        self.optimizer.zero_grad()
        loss = self.criterion(self.model(xb), yb)
        loss.backward()
        self.optimizer.step()
        if self.scheduler is not None:
            self.scheduler.step()
        return loss

    def fit(self, train_loader: Iterable) -> None:
        epochs = math.ceil(self.max_steps / len(train_loader))  # type: ignore[arg-type]
        self.model.train()
        self._hook("on_train_start")
        for _ in range(epochs):
            for xb, yb in train_loader:
                xb, yb = xb.to(self.device), yb.to(self.device)
                loss = self.training_step(xb, yb)
                self.step += 1
                self.metrics.update(loss=loss)
                torch_xla.sync()
                self._hook("on_step_end", loss)
                if self.step == self.max_steps:
                    break
            if self.step == self.max_steps:
                break
        self._hook("on_train_end")
