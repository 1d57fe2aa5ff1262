"""Measure this rank's training speed on the real model, and share the figures with all ranks."""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.balance.memory import (
    MemoryCost,
    PeakMemory,
    exact_host_memory,
    fit_memory,
    memory_limit_bytes,
)
from hetero_strategy.dist import all_gather_floats

__all__ = ["ProbeError", "ProbeExchange", "StepCost", "fit_step_cost", "measure_step_seconds", "probe_step_cost"]


class ProbeError(RuntimeError):
    """The probe failed on some rank; raised on every rank alike, so none is left in a collective."""


@dataclass(frozen=True)
class ProbeExchange:
    """What of the gradient exchange the probe times with each step (the runtime picks it from the
    compression config).

    A dense exchange overlapped with backward competes with it on gloo, so ``dense`` runs a
    gradient-sized all-reduce beside the timed backward. A compressing hook spends CPU (or GPU)
    time per entry on every rank, more on a slow one: ``codec_density`` runs that work on a
    gradient-sized buffer after each backward, inside the timed step, so the plan counts it.
    """

    dense: bool = True
    codec_density: float | None = None
    """Top-K density of the codec work to time (None: no codec)."""
    codec_backend: str = "auto"

    def __bool__(self) -> bool:  # a measure() written for the old ``with_comm`` bool still reads it
        return self.dense


@dataclass(frozen=True)
class StepCost:
    """A rank's step time as ``fixed_s + b / samples_per_s`` for a local batch of b samples.

    The fixed part is what a step costs whatever its batch: per-parameter work (gradient
    accumulation, the all-reduce's CPU share, launch overheads). A purely proportional split
    ignores it and gives a slow rank too many samples, since its fixed part is slower too.
    """

    samples_per_s: float
    fixed_s: float = 0.0
    memory: MemoryCost | None = None
    """The step's memory at the probe's batch sizes (balance/memory.py), when measured."""

    def seconds(self, batch: float) -> float:
        return self.fixed_s + batch / self.samples_per_s


def fit_step_cost(points: list[tuple[int, float]]) -> StepCost:
    """Fit StepCost through (batch, seconds) at two batch sizes; proportional when the fit is unusable.

    Noise can make the smaller batch look as slow as the larger one, or the line cross below zero:
    then the largest batch's plain rate is the safer estimate.
    """
    (b1, t1), (b2, t2) = min(points), max(points)
    plain = StepCost(b2 / max(t2, 1e-9))
    if b2 <= b1 or t2 <= t1:
        return plain
    rate = (b2 - b1) / (t2 - t1)
    fixed = t2 - b2 / rate
    return StepCost(rate, fixed) if fixed >= 0 else plain


def measure_step_seconds(step_fns: Sequence[Callable[[Callable[[], None]], None]], steps: int = 3,
                         warmup: int = 1, comm_numel: int = 0, device: torch.device | None = None) -> list[float]:
    """Median seconds of each ``step_fn(start_comm)``, run in turn (interleaved) ``warmup + steps`` times.

    Interleaving keeps a slow drift of the machine (clock, a neighbour's load) from landing on
    one step function only. Each ``step_fn`` calls ``start_comm()`` where DDP's gradient exchange
    would begin (after the forward pass). With ``comm_numel`` > 0 that starts an all-reduce of as
    many float32 values (the gradient's size), waited for after the clock stops: the figure is
    this rank's compute while an exchange competes with its backward pass, without the wait for
    slower peers. Every rank must call this with the same arguments (except the step functions).

    A step that raises on one rank (e.g. out of memory on the smallest device) does not leave the
    others waiting in a collective: the failing rank still joins every exchange, the ranks agree
    on the failure at the end, and every rank raises :class:`ProbeError`.
    """
    comm = comm_numel > 0 and dist.is_initialized() and dist.get_world_size() > 1
    buf = torch.zeros(comm_numel, dtype=torch.float32, device=device) if comm else None
    times: list[list[float]] = [[] for _ in step_fns]
    failure: Exception | None = None
    for i in range(warmup + steps):
        for k, step_fn in enumerate(step_fns):
            works: list = []

            def start_comm(works: list = works) -> None:
                if buf is not None and not works:
                    works.append(dist.all_reduce(buf, async_op=True))

            _sync()
            t0 = time.perf_counter()
            if failure is None:
                try:
                    step_fn(start_comm)
                    _sync()
                except Exception as e:  # noqa: BLE001 - kept, and raised once every rank knows (below)
                    failure = e
            if i >= warmup:
                times[k].append(time.perf_counter() - t0)
            start_comm()  # a step that never called it must still join the collective
            for work in works:
                work.wait()
    failed = [r for r, (flag,) in enumerate(all_gather_floats([1.0 if failure is not None else 0.0])) if flag]
    if failed:
        why = f"{failure!r}" if failure is not None else f"it failed on rank(s) {failed}"
        raise ProbeError(f"probing the training step failed: {why}") from failure
    return [sorted(t)[len(t) // 2] for t in times]


def probe_step_cost(module: torch.nn.Module, loss_fn: Callable[[Any], torch.Tensor],
                    batches: list[tuple[Any, int]], steps: int,
                    exchange: ProbeExchange | bool = True, with_comm: bool | None = None) -> StepCost:
    """This rank's step cost from forward+backward of ``loss_fn(batch)`` at one or two batch sizes.

    ``batches`` holds (batch, samples) pairs, e.g. the loader's batch and half of it; two timings
    give the per-sample rate and the per-step fixed part (:class:`StepCost`). ``loss_fn`` runs the
    real model's forward on ``module`` (not its DDP wrapper: the probe must not start DDP's
    exchange) and returns a scalar to backpropagate. ``exchange`` (:class:`ProbeExchange`; a bool
    means ``ProbeExchange(dense=...)``) adds the exchange's work on this rank to each timed step, so
    the plan sees the step as training will run it. Every rank must call this with the same sample
    counts, ``steps`` and ``exchange``.

    The probe must not change training: RNG state, buffers (e.g. batch-norm statistics), the
    train/eval mode and gradients are restored.
    """
    rng = torch.random.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if torch.cuda.is_available() and torch.cuda.is_initialized() else None
    buffers = {name: b.detach().clone() for name, b in module.named_buffers()}
    was_training = module.training
    module.train()

    if with_comm is not None:  # the keyword before ProbeExchange existed
        exchange = with_comm
    if isinstance(exchange, bool):
        exchange = ProbeExchange(dense=exchange)
    params = [p for p in module.parameters() if p.requires_grad]
    numel = sum(p.numel() for p in params)
    device = params[0].device if params else None
    codec: list[Callable[[], None]] = []

    def step(batch: Any, start_comm: Callable[[], None]) -> None:
        loss = loss_fn(batch)
        start_comm()  # DDP exchanges gradients during backward, not during forward
        loss.backward()
        if exchange.codec_density is not None and numel:  # the hook encodes every bucket of the step
            if not codec:  # NOTE: built here, so running out of memory is a probe failure like any other
                from hetero_strategy.hooks.cost import CodecWork

                codec.append(CodecWork(numel, device, exchange.codec_backend, exchange.codec_density).run)
            codec[0]()

    comm_numel = numel if exchange.dense else 0
    memory_device = device or torch.device("cpu")
    limit = memory_limit_bytes(memory_device)
    # NOTE: one allocation mode from the first timed step on (under a limit, training keeps it):
    # steps in glibc's default mode leave large free chunks in the heap, which later steps reuse or
    # not by layout, and the resident set then varied by an activation or two between processes
    # (0.70-1.13 MB per sample on tests/test_memory_plan.py's model; 0.84 every time in this mode)
    exact = exact_host_memory(memory_device, keep=limit is not None)
    try:
        with exact:
            # Two warm-up rounds: the first steps at a new shape are slow (kernel selection, allocator
            # growth) and would bias the fitted fixed cost.
            fns = [lambda start, b=b: step(b, start) for b, _ in batches]
            seconds = measure_step_seconds(fns, steps=steps, warmup=2, comm_numel=comm_numel, device=device)
            points = [(n, t) for (_, n), t in zip(batches, seconds)]
            cost = fit_step_cost(points) if len(points) > 1 else StepCost(points[0][0] / max(points[0][1], 1e-9))
            return replace(cost, memory=_step_memory(step, batches, memory_device, limit))
    finally:
        module.train(was_training)
        with torch.no_grad():
            for name, b in module.named_buffers():
                b.copy_(buffers[name])
        for p in module.parameters():
            p.grad = None
        torch.random.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)


def _step_memory(step: Callable[[Any, Callable[[], None]], None], batches: list[tuple[Any, int]],
                 device: torch.device, limit: float | None, repeats: int = 3) -> MemoryCost:
    """``repeats`` more steps at each batch size, smallest first, under PeakMemory (the same on every
    rank: the step's collectives, e.g. FSDP's, are joined alike); one on CUDA, where it is exact."""
    repeats = 1 if device.type == "cuda" else repeats
    growth: dict[int, list[float]] = {}
    start = 0.0
    for _ in range(repeats):
        for batch, n in sorted(batches, key=lambda bn: bn[1]):
            with PeakMemory(device) as peak:
                step(batch, lambda: None)
            # each step's growth over what was in use before it (the median of the repeats),
            # and the largest such base
            growth.setdefault(n, []).append(peak.bytes - peak.start)
            start = max(start, peak.start)
    fit = fit_memory([(n, sorted(g)[len(g) // 2]) for n, g in growth.items()], limit)
    return replace(fit, fixed_bytes=start + fit.fixed_bytes)


def _sync() -> None:
    # NOTE: a device-wide synchronize is fine here: the probe runs once at setup, not in a hook.
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        torch.cuda.synchronize()
