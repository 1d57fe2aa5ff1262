"""Per-rank step timings: compute time (no waiting for peers), step time, their spread, and on
CPU ranks the rank's own work after its last gradient.

Framework-free: the Lightning and Accelerate adapters call the same timer from their own events.
The figures it reports (balance) are defined in :mod:`hetero_strategy.runtime.metrics`.
"""

from __future__ import annotations

import itertools
import math
import statistics
import time
from typing import Any

import torch

from hetero_strategy.dist import all_gather_floats
from hetero_strategy.runtime.metrics import balance

__all__ = ["StepTimer"]


class StepTimer:
    """Times one optimizer step of this rank.

    Compute ends when DDP hands the last gradient bucket to the comm hook (the rest of backward()
    is waiting for peers); on no-sync steps, when backward() returns.

    This rank's own work from its last gradient to the step's end (the exchange's tail it
    computes itself, the optimizer's step), without the wait for peers: ``after_cpu``, the
    process's CPU seconds in that span, and ``pace``, the wall seconds per CPU second of its
    compute; ``after_backward`` = their product, in wall seconds. Only where the hook notes CPU
    time (CPU buckets: gloo computes the exchange on the rank's core and waits without spinning)
    and torch runs one intra-op thread (with more, compute's pace is that of several threads, not
    the exchange's, and idle OpenMP threads may spin while the rank waits); nan elsewhere (GPUs,
    FSDP's reduction, steps without the hook).
    """

    def __init__(self) -> None:
        self.window_start: float | None = None
        self.batch_start_time = 0.0
        self.compute_time = 0.0
        self.step_time = 0.0
        self.after_cpu = self.pace = math.nan
        self._cpu_start = self._compute_cpu = 0.0
        self._hook_cpu: float | None = None
        self._compute_acc = 0.0
        self.history: list[tuple[float, float]] = []  # (compute_s, step_s) per optimizer step
        self.bytes_history: list[int] = []  # wire bytes this rank sent per optimizer step
        self.step_ends: list[float] = []  # perf_counter() at each step's end: wall time incl. data loading

    def batch_start(self) -> None:
        self.batch_start_time = time.perf_counter()
        self._cpu_start = time.process_time()
        if self.window_start is None:
            self.window_start = self.batch_start_time

    def backward_end(self, hook_state: Any = None) -> None:
        """The batch's backward is over; ``hook_state`` (the comm hook's, or None) marks its last
        gradient with ``last_hook_time`` and ``last_hook_cpu`` where this batch reached the hook."""
        now, cpu = time.perf_counter(), time.process_time()
        hooked, hooked_cpu = (getattr(hook_state, k, None) for k in ("last_hook_time", "last_hook_cpu"))
        from_batch = hooked is not None and hooked >= self.batch_start_time
        self._compute_acc += (hooked if from_batch else now) - self.batch_start_time
        self._hook_cpu = hooked_cpu if from_batch and hooked_cpu is not None else None
        self._compute_cpu += (self._hook_cpu if self._hook_cpu is not None else cpu) - self._cpu_start

    def step_end(self, bytes_sent: int = 0) -> None:
        now = time.perf_counter()
        self.compute_time = self._compute_acc
        timed = self._hook_cpu is not None and self._compute_cpu > 0 and torch.get_num_threads() == 1
        self.after_cpu = time.process_time() - self._hook_cpu if timed else math.nan
        self.pace = self.compute_time / self._compute_cpu if timed else math.nan
        self.step_time = now - (self.window_start if self.window_start is not None else now)
        self.history.append((self.compute_time, self.step_time))
        self.bytes_history.append(int(bytes_sent))
        self.step_ends.append(now)
        del self.history[:-200]  # bounded: calibration uses at most the last 100 steps
        del self.bytes_history[:-200]
        del self.step_ends[:-200]
        self._compute_acc = self._compute_cpu = 0.0
        self._hook_cpu = None
        self.window_start = None

    @property
    def after_backward(self) -> float:
        """This rank's own work after its last gradient, in wall seconds (nan where not measured)."""
        return self.after_cpu * self.pace

    def gather_metrics(self, local_batch: int, extra: dict[str, float] | None = None) -> dict[str, float]:
        """All ranks' batch size, times and speed, plus the balance (one all-gather).

        ``extra`` per-rank figures (e.g. the hook's bytes sent and density) ride in the same gather
        and are logged as ``hetero/<name>_r<rank>``.
        """
        names = sorted(extra or {})
        mine = [float(local_batch), self.compute_time, self.step_time, self.after_backward] + \
            [float(extra[n]) for n in names]
        rows = all_gather_floats(mine)
        metrics: dict[str, float] = {}
        for r, (b, compute, step, after, *more) in enumerate(rows):
            for name, value in zip(names, more):
                metrics[f"hetero/{name}_r{r}"] = value
            if math.isfinite(after):  # CPU ranks: own work after the last gradient (the calibrator's a_r)
                metrics[f"hetero/after_s_r{r}"] = after
            metrics[f"hetero/batch_size_r{r}"] = b
            metrics[f"hetero/compute_s_r{r}"] = compute
            metrics[f"hetero/step_s_r{r}"] = step
            metrics[f"hetero/samples_per_s_r{r}"] = b / compute if compute > 0 else 0.0
        metrics["hetero/balance"] = balance([row[1] for row in rows])
        return metrics

    def summary(self, batch_sizes: list[int], last: int = 100) -> dict[str, object]:
        """The run's figures over its last ``last`` steps, the same on every rank (one all-gather).

        Medians, so the first (warm-up) steps and a stray slow one do not move them:
        ``step_s`` is the slowest rank's median wall time from one step's end to the next (data
        loading, compute, communication and the optimizer: what a user waits for), and
        ``samples_per_s`` the global batch over it; ``balance`` compares the ranks' median
        compute times; ``bytes_sent_per_step`` is each rank's median wire bytes per step.
        """
        hist, sent = self.history[-last:], self.bytes_history[-last:]
        ends = self.step_ends[-(last + 1):]
        walls = [b - a for a, b in itertools.pairwise(ends)] or [s for _, s in hist]  # one step: its own time
        mine = [statistics.median(c for c, _ in hist) if hist else 0.0,
                statistics.median(walls) if walls else 0.0,
                float(statistics.median(sent)) if sent else 0.0, float(len(hist))]
        rows = all_gather_floats(mine)
        step_s = max(row[1] for row in rows)
        return {
            "window_steps": int(min(row[3] for row in rows)),
            "batch_sizes": list(batch_sizes),
            "samples_per_s": sum(batch_sizes) / step_s if step_s > 0 else 0.0,
            "step_s": step_s,
            "balance": balance([row[0] for row in rows]),
            "bytes_sent_per_step": [int(row[2]) for row in rows],
        }
