"""Per step of one rank: start time, local batch size and compute time, for plain DDP and hetero alike.

The demo and the benchmarks time every run with it (the runtime's own ``StepTimer`` exists only
under hetero). Plain PyTorch; a tensor hook changes no result.

Example::

    clock = StepClock()
    clock.attach(model)
    for batch in loader:
        clock.batch_start(len(batch[0]))
        ...  # forward, backward, optimizer step
        clock.batch_end()
    clock.close()
    record = clock.record("ddp")   # {"mode", "starts", "batches", "compute_s"}

    StepClock(counter=read_tx_bytes)   # also "sent": the counter at each step's start and at the end
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import torch

__all__ = ["StepClock"]


class StepClock:
    """Per training step on this rank: start time, local batch size and compute time.

    Compute ends when autograd has produced the gradient of the model's first layer (the last
    gradient of backward): DDP's all-reduce only waits after that, so the span excludes waiting
    for peers. The same clock serves plain DDP, hetero and solo runs (a tensor hook changes none).
    """

    def __init__(self, counter: Callable[[], int] | None = None) -> None:
        self.counter = counter
        """Read at each step's start and at the close (e.g. the bytes this rank's interface sent)."""
        self.sent: list[int] = []
        self.starts: list[float] = []
        self.batches: list[int] = []
        self.compute_s: list[float] = []
        self._grad_time: float | None = None

    def attach(self, module: torch.nn.Module) -> None:
        first = next(p for p in module.parameters() if p.requires_grad)
        first.register_hook(self._grad_ready)

    def _grad_ready(self, grad: torch.Tensor) -> None:
        self._grad_time = time.perf_counter()

    def batch_start(self, n: int) -> None:
        if self.counter is not None:  # before the clock: the previous step's exchange is done by now
            self.sent.append(self.counter())
        self.starts.append(time.perf_counter())
        self.batches.append(int(n))
        self._grad_time = None

    def batch_end(self) -> None:
        end = self._grad_time if self._grad_time is not None else time.perf_counter()
        self.compute_s.append(end - self.starts[-1])

    def close(self) -> None:
        self.starts.append(time.perf_counter())  # closes the last step
        if self.counter is not None:
            self.sent.append(self.counter())

    def record(self, mode: str) -> dict[str, Any]:
        out = {"mode": mode, "starts": self.starts, "batches": self.batches, "compute_s": self.compute_s}
        return out | ({"sent": self.sent} if self.counter is not None else {})
