"""A named model's training step timed on this rank, for a profile (``hetero-strategy profile --model``).

The planner rates a rank from its card (``efficiency`` x peak TFLOP/s over the model's FLOPs per
sample). Where the rank can run the model, the real step is better: this builds the model of
:func:`~hetero_strategy.cluster.model.model_builder` for real, repeats its example batch to ``b``
and ``b / 2`` samples, and fits the probe's :class:`~.probe.StepCost` (fixed + b / rate) through
forward and backward at the two sizes, without any exchange (the cost model adds that). The
optimizer's step (SGD with momentum: a few passes over every parameter, whatever the batch) is
timed apart and reported as ``optimizer_s``, part of the step's fixed cost. ``codec_s`` holds what
``compression="auto"`` measures of each codec (its stand-ins, from which it decides), ``hook_s``
what each codec's hook costs a step under DDP (:mod:`hetero_strategy.hooks.timing`, what a step pays):
its CPU seconds over ``cpu_share``, the share of a core the timed windows got (CPU time over wall
time: under a quota, 0.25 of a core's rank gets ~0.25), so a quota's 100 ms bursts do not blur it.
With a gloo group of two or more ranks up, ``exchange_cpu_s`` is what DDP's dense exchange over
that group adds to a step in CPU seconds on this rank (the DDP step less the bare one, at the
larger batch, in windows taking turns with the bare ones; at least 0): on a CPU rank gloo reduces
and copies on the core backward runs on, and the two threads disturb each other; on ResNet-18 on
1.0 / 0.57 of a core that measured 1.0-2.2x the all-reduce's own CPU time alone (docs/planner.md).

Example::

    measure_model_step("resnet18", batch=32)   # {"model", "batch", "samples_per_s", "fixed_s", "optimizer_s",
                                               #  "codec_s", "cpu_share", "hook_s", "exchange_cpu_s"}
"""

from __future__ import annotations

import math
import statistics
import time
from typing import Any

import torch

from hetero_strategy.balance.probe import StepCost, fit_step_cost
from hetero_strategy.balance.timing import busy_until_all_arrive
from hetero_strategy.cluster.model import model_builder, model_loss
from hetero_strategy.hooks.auto import CANDIDATES, Candidate
from hetero_strategy.hooks.timing import hook_seconds

__all__ = ["HOOK_LABELS", "measure_model_step", "repeat_batch", "varied"]

#: the codecs whose hook the profile times as DDP runs it (:func:`~hetero_strategy.hooks.timing.hook_seconds`):
#: every ``compression="auto"`` candidate, and the all-gather Top-K at each of its densities
HOOK_LABELS = tuple([c.label for c in CANDIDATES] +
                    [Candidate("topk", density=c.density).label for c in CANDIDATES if c.codec == "topk_allreduce"])


def repeat_batch(batch: Any, size: int) -> Any:
    """``batch`` (a tensor, a tuple or a dict of tensors whose first dimension is samples) repeated
    along that dimension to ``size`` samples."""
    if isinstance(batch, dict):
        return {k: repeat_batch(v, size) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(repeat_batch(v, size) for v in batch)
    reps = -(-size // batch.shape[0])
    return batch.repeat(reps, *([1] * (batch.dim() - 1)))[:size]


def measure_model_step(spec: str, batch: int, steps: int = 3, window_s: float = 1.0) -> dict[str, Any]:
    """This rank's step cost on ``spec`` at ``batch`` and ``batch // 2`` samples.

    Each figure is the median over ``steps`` windows of consecutive steps lasting ``window_s`` or
    more, the two sizes interleaved, every rank of the job timing at once (collective when a
    process group is up). NOTE: not single steps: under a CPU quota (a cgroup's, or a
    shared host's) a step runs in bursts of the scheduler's period (100 ms), so one step's time is
    off by up to a period, and the fixed part, the difference of two such times, by twice that.
    """
    torch.manual_seed(0)
    model, example = model_builder(spec)()
    model.train()
    sizes = sorted({batch, max(1, batch // 2)}, reverse=True)
    batches = [repeat_batch(example, b) for b in sizes]

    spent = [0.0, 0.0]  # CPU seconds, wall seconds of the timed windows
    cpu_per_step: list[float] = []  # of the larger batch's windows

    def run(x: Any, reps: int) -> float:
        t0, c0 = time.perf_counter(), time.process_time()
        for _ in range(reps):
            model_loss(model, x).backward()
        wall, cpu = time.perf_counter() - t0, time.process_time() - c0
        spent[0] += cpu
        spent[1] += wall
        if x is batches[0]:
            cpu_per_step.append(cpu / reps)
        return wall / reps

    reps = [max(1, math.ceil(window_s / max(run(x, 1), run(x, 1), 1e-6))) for x in batches]  # 2 warm-ups
    exchange = _ExchangeWindow.start(model, batches[0], window_s)
    windows: list[list[float]] = [[] for _ in sizes]
    # NOTE: every rank times its windows while the others step too, as in training: the ranks start
    # together, and one that is done keeps stepping until the last is (busy_until_all_arrive)
    def untimed() -> None:
        model_loss(model, batches[-1]).backward()

    busy_until_all_arrive(untimed)
    spent[:] = [0.0, 0.0]
    cpu_per_step.clear()
    for _ in range(steps):
        for k, x in enumerate(batches):
            windows[k].append(run(x, reps[k]))
        if exchange is not None:  # NOTE: not in ``spent``: its waits for peers are no quota's
            exchange.run()
    busy_until_all_arrive(untimed)
    exchange_cpu_s = None if exchange is None else \
        max(0.0, statistics.median(exchange.cpu_per_step) - statistics.median(cpu_per_step))
    del exchange  # NOTE: the DDP copy and its buckets, before the hooks' own copies are timed
    cost = fit_step_cost([(b, statistics.median(w)) for b, w in zip(sizes, windows)]) if len(sizes) > 1 else \
        StepCost(sizes[0] / statistics.median(windows[0]))
    share = min(1.0, spent[0] / spent[1]) if spent[1] > 0 and spent[0] > 0 else 1.0
    for p in model.parameters():
        p.grad = None
    return {"model": spec, "batch": sizes, "samples_per_s": cost.samples_per_s, "fixed_s": cost.fixed_s,
            "optimizer_s": _optimizer_seconds(model, steps), "codec_s": codec_seconds(model),
            "cpu_share": share,
            "hook_s": {k: v / share for k, v in hook_seconds(model, varied(batches[0]), model_loss, HOOK_LABELS).items()},
            "exchange_cpu_s": exchange_cpu_s}


class _ExchangeWindow:
    """Windows of DDP steps (dense, default buckets) on a copy of the model over the job's group,
    CPU seconds per step each. Collective: every rank runs as many steps per window, enough for the
    slowest rank's window to last ``window_s`` (a step over a slow link takes seconds: one then)."""

    def __init__(self, ddp: torch.nn.Module, batch: Any, reps: int) -> None:
        self.ddp, self.batch, self.reps = ddp, batch, reps
        self.cpu_per_step: list[float] = []

    @classmethod
    def start(cls, model: torch.nn.Module, batch: Any, window_s: float) -> _ExchangeWindow | None:
        """None without a gloo group of two or more ranks (the model is on the CPU, which NCCL
        cannot exchange; the planner uses the figure on CPU ranks only)."""
        import copy

        import torch.distributed as dist
        from torch.nn.parallel import DistributedDataParallel

        from hetero_strategy.dist import all_gather_floats

        if not (dist.is_available() and dist.is_initialized()) or dist.get_world_size() < 2 \
                or dist.get_backend() != "gloo":
            return None
        window = cls(DistributedDataParallel(copy.deepcopy(model)), batch, 1)
        window.run()  # DDP rebuilds its buckets in the order of the first backward's gradients
        t0 = time.perf_counter()
        window.run()
        slowest = max(row[0] for row in all_gather_floats([time.perf_counter() - t0]))
        window.cpu_per_step.clear()
        window.reps = max(1, math.ceil(window_s / max(slowest, 1e-6)))
        return window

    def run(self) -> None:
        c0 = time.process_time()
        for _ in range(self.reps):
            model_loss(self.ddp, self.batch).backward()
        self.cpu_per_step.append((time.process_time() - c0) / self.reps)


def varied(batch: Any) -> Any:
    """``batch`` with its floating-point tensors drawn at random (integers, e.g. token ids, kept).

    NOTE: a model's example batch is often zeros; its gradient then holds many equal entries, and
    Top-K's threshold selection on ties measured ~10x slower than on a real gradient."""
    if isinstance(batch, dict):
        return {k: varied(v) for k, v in batch.items()}
    if isinstance(batch, (tuple, list)):
        return tuple(varied(v) for v in batch)
    return torch.randn_like(batch) if batch.is_floating_point() else batch


def codec_seconds(model: torch.nn.Module) -> dict[str, float]:
    """Seconds of each ``compression="auto"`` candidate's codec work on this model's gradient, per
    step, keyed by the candidate's label: measured as ``compression="auto"`` measures it
    (:func:`hetero_strategy.hooks.auto.measure`), without its collectives."""
    from hetero_strategy.hooks.auto import CANDIDATES, powersgd_seconds
    from hetero_strategy.hooks.cost import measure_codec_seconds_per_entry

    shapes = [tuple(p.shape) for p in model.parameters() if p.requires_grad]
    numel = sum(math.prod(s) for s in shapes)
    cpu = torch.device("cpu")
    out = {}
    for c in CANDIDATES:
        if c.codec == "topk_allreduce":
            per_entry = measure_codec_seconds_per_entry(cpu, "auto", c.density)
            # the all-gather Top-K encodes alike (error feedback, then the selection)
            out[c.label] = out[f"topk density {c.density:g}"] = per_entry * numel
        elif c.codec == "powersgd":
            out[c.label] = powersgd_seconds(shapes, c.rank, cpu)
    return out


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
