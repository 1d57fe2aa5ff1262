"""Measure this rank's training speed on the real model, and share the figures with all ranks."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, replace
from typing import Any

import torch

from hetero_strategy.balance.memory import (
    MemoryCost,
    PeakMemory,
    exact_host_memory,
    fit_memory,
    memory_limit_bytes,
)
from hetero_strategy.balance.timing import ProbeError, measure_step_seconds, measure_steps

__all__ = ["PROBE_MAX_S", "PROBE_SPREAD", "PROBE_WINDOW_S", "ProbeError", "ProbeExchange", "StepCost",
           "fit_step_cost", "measure_step_seconds", "probe_step_cost"]

PROBE_WINDOW_S = 0.01
"""Least seconds of one timed window of the probe: many steps of a model that steps in well under
a millisecond, one step of a large one. Two cgroup-quota periods of the emulated cluster (10 ms),
so a throttled rank's windows all see its quota."""
PROBE_SPREAD = 0.05
"""The probe times more windows (up to 3x ``probe_steps``) while a rank's spread exceeds this."""
PROBE_MAX_S = 0.3
"""...and while the timed windows have lasted less than this on every rank. (5 s, tried at c840c07,
did not narrow the static split of bench balance's 1.0 / 0.57 cluster: [84, 44] to [111, 17]
across five launches, against [76, 52] to [104, 24] before; docs/benchmarks.md.)"""


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
    spread: float = 0.0
    """Relative noise of the measured step times (the larger of the probed sizes'; timing.py)."""

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
            timed = measure_steps(fns, steps=steps, warmup=2, comm_numel=comm_numel, device=device,
                                  min_seconds=PROBE_WINDOW_S, target_spread=PROBE_SPREAD, max_seconds=PROBE_MAX_S)
            points = [(n, t.seconds) for (_, n), t in zip(batches, timed)]
            cost = fit_step_cost(points) if len(points) > 1 else StepCost(points[0][0] / max(points[0][1], 1e-9))
            return replace(cost, memory=_step_memory(step, batches, memory_device, limit),
                           spread=max(t.spread for t in timed))
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

