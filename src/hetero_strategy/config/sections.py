"""Balance and calibration sections: how the global batch is split, and rebalanced online."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from hetero_strategy.config.errors import (
    _check_positive_list,
    _fail,
    _fail_rank_count,
    _number,
    _plain,
    _whole,
)

LOSS_NORMALIZATIONS = ("samples", "tokens")  # what a loss averages over (BalanceConfig.loss_normalization)

__all__ = ["BalanceConfig", "CalibrationConfig"]


@dataclass(kw_only=True, slots=True)
class BalanceConfig:
    """How the global batch is split across ranks (docs/design.md semantics 1-4)."""

    batch_sizes: list[int] | None = None
    """Explicit per-rank batch sizes; their sum must equal dataloader batch_size x world_size."""
    capacities: list[float] | None = None
    """Relative per-rank capacities; batch shares are proportional to them."""
    alpha: float = 0.7
    """Weight of measured compute speed in capacity = alpha*compute + beta*bandwidth."""
    beta: float = 0.3
    """Weight of measured link bandwidth in the capacity model."""
    max_batch_sizes: list[int] | None = None
    """Optional per-rank memory cap on one forward/backward pass (samples). A rank's share of the
    global batch follows capacity; a share above the cap runs as several passes of at most the cap,
    with the gradient synchronised after the last one (micro-batching, runtime/micro.py)."""
    memory_margin: float = 0.1
    """Without ``max_batch_sizes``: the share of each rank's memory limit the probe's caps leave free
    (CUDA: the device's total memory; CPU: the cgroup limit, if any)."""
    probe_steps: int = 15
    """Timed windows per batch size for the automatic probe (when neither batch_sizes nor
    capacities are given); a window holds forward+backward passes for at least 10 ms, and up to
    3x as many windows are timed while they disagree by more than 5% (balance/timing.py). 15, not
    5: a host's speed drifts over seconds, which a short probe takes for the ranks' speeds. On
    bench balance's 1.0 / 0.57 cluster (two paired runs of benchmarks/bench_probe_spread.py) the
    split's sd across probes went from 5.4 to 3.7 samples, and splits 8+ samples off from 4 to 1
    in 24: weak evidence, against a cost paid once (docs/benchmarks.md). Lower it where one step
    takes seconds and the devices are steady."""
    seed: int | None = None
    """Shuffle seed of the training sampler; None takes PL_GLOBAL_SEED (as Lightning does) or 0."""
    profile: str | None = None
    """A cluster-profile JSON (``hetero-strategy profile --json``): its per-rank link bandwidth is
    the beta term of the capacity model; compute is still probed on the real model."""
    sample_cost: str | Callable[[int], float] | None = None
    """Variable-length samples: the name of a training-dataset attribute holding one cost per sample
    (e.g. ``"lengths"``, token counts), or a function of the sample index (e.g.
    ``lambda i: len(tokens[i])``). Each global batch is then dealt out by predicted time instead of
    by count; None splits by count."""
    loss_normalization: str = "samples"
    """What the loss averages over: "samples" (a mean over samples) or "tokens" (a mean over
    tokens, whose counts are then ``sample_cost``); each rank is weighted by its part of it."""

    def __post_init__(self) -> None:
        _check_positive_list("batch_sizes", self.batch_sizes, integer=True)
        _check_positive_list("capacities", self.capacities, integer=False)
        _check_positive_list("max_batch_sizes", self.max_batch_sizes, integer=True)
        if not _number(self.memory_margin) \
                or not 0 <= self.memory_margin < 1:
            _fail("memory_margin", self.memory_margin, "give a fraction in [0, 1), e.g. 0.1 to keep 10% free")
        if self.batch_sizes is not None and self.capacities is not None:
            _fail("capacities", self.capacities, "give either batch_sizes or capacities, not both")
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if not _number(v) or not 0.0 <= v <= 1.0:
                _fail(name, v, "must lie in [0, 1] (defaults alpha=0.7, beta=0.3)")
        if self.alpha == 0 and self.beta == 0:
            _fail("alpha", self.alpha, "alpha and beta cannot both be 0; use the defaults 0.7 and 0.3")
        if not _whole(self.probe_steps) or self.probe_steps < 1:
            _fail("probe_steps", self.probe_steps, "must be an integer >= 1")
        if self.seed is not None and not _whole(self.seed):
            _fail("seed", self.seed, "must be an integer or None")
        if self.sample_cost is not None and not callable(self.sample_cost) and (
                not isinstance(self.sample_cost, str) or not self.sample_cost):
            _fail("sample_cost", self.sample_cost, "name the dataset attribute with one cost per sample, e.g. "
                  "'lengths', or give a function of the sample index, e.g. lambda i: len(tokens[i])")
        if self.loss_normalization not in LOSS_NORMALIZATIONS:
            _fail("loss_normalization", self.loss_normalization, "choose 'samples' or 'tokens'")
        if self.loss_normalization == "tokens" and self.sample_cost is None:
            _fail("loss_normalization", self.loss_normalization,
                  "a mean over tokens needs each sample's token count: set sample_cost='<dataset attribute>' "
                  "or sample_cost=<function of the sample index>")
        if self.profile is not None and not isinstance(self.profile, (str, Path)):
            _fail("profile", self.profile, "give the path of a cluster-profile JSON, or None")
        if self.profile is not None and not os.path.isfile(self.profile):  # False for a name too long too
            _fail("profile", self.profile, "no such file; write one with `hetero-strategy profile --json PATH`")
        _plain(self)

    def check_world_size(self, world_size: int, global_batch: int | None = None) -> None:
        """Refuse per-rank lists that do not match the job (called once the world size is known)."""
        for name in ("batch_sizes", "capacities", "max_batch_sizes"):
            values = getattr(self, name)
            if values is not None and len(values) != world_size:
                _fail_rank_count(name, values, world_size)
        if global_batch is None:
            return
        if global_batch < world_size:
            _fail("batch_size", global_batch // max(world_size, 1),
                  f"the global batch {global_batch} is smaller than the world size {world_size}; "
                  "every rank needs at least one sample")
        if self.batch_sizes is not None and sum(self.batch_sizes) != global_batch:
            _fail("batch_sizes", self.batch_sizes,
                  f"they sum to {sum(self.batch_sizes)} but dataloader batch_size x world_size = "
                  f"{global_batch}; make them sum to {global_batch}")


@dataclass(kw_only=True, slots=True)
class CalibrationConfig:
    """Online rebalancing of batch shares (docs/design.md semantics 5)."""

    calibrate: bool = False
    """Move batch shares toward equal per-rank finishing times while training."""
    cold_start_steps: int = 10
    """Steps run on the static plan before any timing is trusted."""
    recalibrate_every: int = 50
    """Steps between two rebalancing decisions."""
    window: int = 50
    """Number of recent steps whose timings a decision uses (20-100)."""
    max_change: float = 0.15
    """Largest relative change of one rank's share in one decision."""

    def __post_init__(self) -> None:
        if not isinstance(self.calibrate, bool):
            _fail("calibrate", self.calibrate, "must be true or false")
        for name in ("cold_start_steps", "recalibrate_every", "window"):
            v = getattr(self, name)
            if not _whole(v) or v < (0 if name == "cold_start_steps" else 1):
                _fail(name, v, "must be a positive integer")
        if not 20 <= self.window <= 100:
            _fail("window", self.window, "use a window of 20 to 100 steps")
        if not _number(self.max_change) or not 0.0 < self.max_change <= 1.0:
            _fail("max_change", self.max_change, "must lie in (0, 1]; the default is 0.15")
