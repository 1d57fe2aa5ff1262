"""A named model's training step timed on this rank, for a profile (``hetero-strategy profile --model``).

The planner rates a rank from its card (``efficiency`` x peak TFLOP/s over the model's FLOPs per
sample). Where the rank can run the model, the real step is better: this builds the model of
:func:`~hetero_strategy.cluster.model.model_builder` for real, repeats its example batch to ``b``
and ``b / 2`` samples, and fits the probe's :class:`~.probe.StepCost` (fixed + b / rate) through
forward and backward at the two sizes, without any exchange (the cost model adds that). The
optimizer's step (SGD with momentum: a few passes over every parameter, whatever the batch) is
timed apart and reported as ``optimizer_s``, part of the step's fixed cost.

Example::

    measure_model_step("resnet18", batch=32)   # {"model", "batch", "samples_per_s", "fixed_s", "optimizer_s"}
"""

from __future__ import annotations

import time
from typing import Any

import torch

from hetero_strategy.balance.probe import ProbeExchange, probe_step_cost
from hetero_strategy.cluster.model import model_builder, model_loss

__all__ = ["measure_model_step", "repeat_batch"]


def repeat_batch(batch: Any, size: int) -> Any:
    """``batch`` (a tensor, a tuple or a dict of tensors whose first dimension is samples) repeated
    along that dimension to ``size`` samples."""
    if isinstance(batch, dict):
        return {k: repeat_batch(v, size) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(repeat_batch(v, size) for v in batch)
    reps = -(-size // batch.shape[0])
    return batch.repeat(reps, *([1] * (batch.dim() - 1)))[:size]


def measure_model_step(spec: str, batch: int, steps: int = 3) -> dict[str, Any]:
    """This rank's step cost on ``spec`` at ``batch`` and ``batch // 2`` samples (collective when a
    process group is up: every rank must call it with the same arguments)."""
    torch.manual_seed(0)
    model, example = model_builder(spec)()
    sizes = sorted({batch, max(1, batch // 2)}, reverse=True)
    batches = [(repeat_batch(example, b), b) for b in sizes]
    cost = probe_step_cost(model, lambda b: model_loss(model, b), batches, steps, exchange=ProbeExchange(dense=False))
    return {"model": spec, "batch": sizes, "samples_per_s": cost.samples_per_s, "fixed_s": cost.fixed_s,
            "optimizer_s": _optimizer_seconds(model, steps)}


def _optimizer_seconds(model: torch.nn.Module, steps: int) -> float:
    """Median seconds of ``torch.optim.SGD(momentum=0.9).step()`` + ``zero_grad`` on the model's
    parameters (the recipes' and benchmarks' optimizer); the weights are put back after."""
    params = [p for p in model.parameters() if p.requires_grad]
    saved = [p.detach().clone() for p in params]
    opt = torch.optim.SGD(params, lr=1e-3, momentum=0.9)
    times = []
    for i in range(steps + 1):
        for p in params:
            p.grad = torch.ones_like(p)
        t0 = time.perf_counter()
        opt.step()
        opt.zero_grad(set_to_none=True)
        if i:  # the first step allocates the momentum buffers
            times.append(time.perf_counter() - t0)
    with torch.no_grad():
        for p, s in zip(params, saved):
            p.copy_(s)
    return sorted(times)[len(times) // 2]
