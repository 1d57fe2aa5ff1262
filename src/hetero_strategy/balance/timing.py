"""Timing a training step on every rank alike, with its noise; and whether ranks differ beyond it.

A step of a small model takes well under a millisecond: one timed step is mostly the scheduler's
and the timer's noise, and two identical ranks were measured almost 3x apart. So each
measurement is a *window* of as many steps as make it last ``min_seconds`` on the fastest rank,
windows are repeated until their spread is small (bounded in count and time), and the spread
travels with the figure, so the planner can tell a real difference from noise
(:func:`equal_within_noise`).

Every loop count here is agreed through an all-gather, so each rank runs the same number of
steps: a step may hold collectives (the probe's competing all-reduce, FSDP's gathers).
"""

from __future__ import annotations

import math
import statistics
import time
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
import torch.distributed as dist

from hetero_strategy.dist import all_gather_floats

__all__ = ["ProbeError", "StepTiming", "busy_until_all_arrive", "equal_within_noise", "measure_step_seconds",
           "measure_steps", "relative_spread"]

_MAX_REPS = 10_000
"""At most this many steps per window (a step function that does nothing must still end)."""
EQUAL_FLOOR = 0.03
"""The least relative noise assumed of any rank's figure: identical ranks on one machine differ by
a few per cent from where their memory and caches sit, however long they are timed."""


class ProbeError(RuntimeError):
    """The probe failed on some rank; raised on every rank alike, so none is left in a collective."""


class StepTiming(NamedTuple):
    """A step's median seconds over the timed windows, and their spread relative to it."""

    seconds: float
    spread: float


def relative_spread(values: Sequence[float]) -> float:
    """Half the interquartile range of ``values`` over their median (0 for fewer than two values).

    The middle half, not the range: one window hit by a neighbour's burst of work says little about
    how well the median is known."""
    if len(values) < 2:
        return 0.0
    mid = statistics.median(values)
    lo, _, hi = statistics.quantiles(values, n=4, method="inclusive")  # linear between closest ranks
    return (hi - lo) / 2 / mid if mid > 0 else 0.0


def equal_within_noise(seconds: Sequence[float], spreads: Sequence[float], floor: float = EQUAL_FLOOR) -> bool:
    """True when one step time lies within every rank's noise band ``seconds * (1 ± spread)``.

    Each band's half-width is at least ``floor``. A pure function of the figures: every rank calls
    it on the same all-gathered numbers and takes the same decision.

    Example::

        >>> equal_within_noise([1.0, 1.05], [0.02, 0.04])   # bands overlap
        True
        >>> equal_within_noise([1.0, 1.75], [0.02, 0.04])   # a 0.57 rank next to a 1.0 one
        False
    """
    widths = [max(floor, s) for s in spreads]
    return max(t * (1 - w) for t, w in zip(seconds, widths)) <= min(t * (1 + w) for t, w in zip(seconds, widths))


def measure_step_seconds(step_fns: Sequence[Callable[[Callable[[], None]], None]], steps: int = 3,
                         warmup: int = 1, comm_numel: int = 0, device: torch.device | None = None) -> list[float]:
    """The median seconds of each step function: :func:`measure_steps` with one step per window."""
    return [t.seconds for t in measure_steps(step_fns, steps, warmup, comm_numel, device)]


def measure_steps(step_fns: Sequence[Callable[[Callable[[], None]], None]], steps: int = 3, warmup: int = 1,
                  comm_numel: int = 0, device: torch.device | None = None, *, min_seconds: float = 0.0,
                  target_spread: float = math.inf, max_seconds: float = math.inf) -> list[StepTiming]:
    """Each ``step_fn(start_comm)``'s median seconds per step and spread, run in turn (interleaved).

    1. ``warmup`` rounds of one step each (at least one with ``min_seconds``); the quickest gives
       every rank's time of one step.
    2. A window of each function holds ``ceil(min_seconds / fastest rank's step)`` steps (at least 1,
       the same on every rank); its figure is its seconds per step.
    3. ``steps`` rounds of windows, then more while some rank's spread (:func:`relative_spread`)
       exceeds ``target_spread``, up to ``3 * steps`` rounds and ``max_seconds`` on the slowest rank.

    Interleaving keeps a slow drift of the machine from landing on one function only. Each
    ``step_fn`` calls ``start_comm()`` where DDP's gradient exchange would begin (after the forward
    pass). With ``comm_numel`` > 0 that starts an all-reduce of as many float32 values (the
    gradient's size), waited for after the clock stops: the figure is this rank's compute while an
    exchange competes with its backward pass, without the wait for slower peers. Every rank must
    call this with the same arguments (except the step functions).

    A step that raises on one rank (e.g. out of memory on the smallest device) does not leave the
    others waiting in a collective: the failing rank still joins every exchange, the ranks agree
    on the failure at the next agreement, and every rank raises :class:`ProbeError`.
    """
    comm = comm_numel > 0 and dist.is_initialized() and dist.get_world_size() > 1
    buf = torch.zeros(comm_numel, dtype=torch.float32, device=device) if comm else None
    failure: list[Exception] = []

    def window(step_fn: Callable[[Callable[[], None]], None], reps: int) -> float:
        total = 0.0
        for _ in range(reps):
            works: list = []

            def start_comm(works: list = works) -> None:
                if buf is not None and not works:
                    works.append(dist.all_reduce(buf, async_op=True))

            _sync()
            t0 = time.perf_counter()
            if not failure:
                try:
                    step_fn(start_comm)
                    _sync()
                except Exception as e:  # noqa: BLE001 - kept, and raised once every rank knows (_agree)
                    failure.append(e)
            total += time.perf_counter() - t0
            start_comm()  # a step that never called it must still join the collective
            for work in works:
                work.wait()
        return total / reps

    first = [math.inf] * len(step_fns)
    for _ in range(max(warmup, 1 if min_seconds > 0 else 0)):
        first = [min(f, window(fn, 1)) for f, fn in zip(first, step_fns)]
    rows = _agree(failure, [min(f, 1e9) for f in first])
    reps = [min(_MAX_REPS, max(1, math.ceil(min_seconds / max(min(row[k] for row in rows), 1e-9))))
            for k in range(len(step_fns))] if min_seconds > 0 else [1] * len(step_fns)
    times: list[list[float]] = [[] for _ in step_fns]
    start = time.perf_counter()
    for i in range(3 * steps):
        for k, fn in enumerate(step_fns):
            times[k].append(window(fn, reps[k]))
        if i + 1 < steps:
            continue
        spread = max(relative_spread(t) for t in times)
        rows = _agree(failure, [spread, time.perf_counter() - start])
        if max(r[0] for r in rows) <= target_spread or max(r[1] for r in rows) >= max_seconds:
            break
    return [StepTiming(statistics.median(t), relative_spread(t)) for t in times]


def busy_until_all_arrive(step: Callable[[], None], limit_s: float = 300.0) -> int:
    """Run ``step`` (untimed) until every rank has called this; returns how many steps ran.

    A rank whose timed work ends early keeps its core, caches and memory bus as busy as training
    would while the slower ranks finish theirs: timed beside idle peers a rank measures faster than
    it trains (the emulated clusters share two cores' caches; two profiles of one 0.57-core rank
    read 167 and 264 samples/s). Collective; bounded by ``limit_s`` (a peer that never arrives is
    then waited for by the barrier's own timeout)."""
    if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2:
        return 0
    arrived = dist.barrier(async_op=True)
    deadline, count = time.monotonic() + limit_s, 0
    while not arrived.is_completed() and time.monotonic() < deadline:
        step()
        count += 1
    arrived.wait()
    return count


def _agree(failure: list[Exception], values: list[float]) -> list[list[float]]:
    """Every rank's ``values``, after every rank has learnt whether some rank's step failed."""
    rows = all_gather_floats([1.0 if failure else 0.0, *values])
    failed = [r for r, row in enumerate(rows) if row[0]]
    if failed:
        why = f"{failure[0]!r}" if failure else f"it failed on rank(s) {failed}"
        raise ProbeError(f"probing the training step failed: {why}") from (failure[0] if failure else None)
    return [row[1:] for row in rows]


def _sync() -> None:
    # NOTE: a device-wide synchronize is fine here: the probe runs once at setup, not in a hook.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
