"""The static plan: which per-rank batch sizes a run starts from (DESIGN.md semantics 1 and 4).

One policy for every adapter, in order of precedence:

1. explicit ``batch_sizes``;
2. ``capacities``, split in proportion (with the per-rank memory caps);
3. measured compute (the probe on the real model) with a profile's link bandwidth: the capacity
   model alpha * compute + beta * bandwidth, split in proportion;
4. measured compute alone: the affine step cost (fixed + b / rate) of every rank, split so the
   predicted step times are equal;
5. equal shares when the probe cannot run (e.g. manual optimization), with a warning.

Steps 3-5 are collective: every rank must call :func:`plan_batch_sizes` with the same config.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from hetero_strategy.balance import capacity, split_batch, split_batch_timed
from hetero_strategy.balance.probe import ProbeExchange, StepCost
from hetero_strategy.config import BalanceConfig, CompressionConfig, ConfigError
from hetero_strategy.dist import all_gather_floats

__all__ = ["gather_step_costs", "plan_batch_sizes", "probe_exchange", "profile_bandwidth"]

log = logging.getLogger("hetero_strategy")

Probe = Callable[[], "StepCost | None"]
Say = Callable[[str], None]


def plan_batch_sizes(cfg: BalanceConfig, world_size: int, global_batch: int, probe: Probe | None,
                     info: Say = log.info, warn: Say = log.warning,
                     on_costs: Callable[[list[StepCost]], None] | None = None) -> list[int]:
    """Per-rank batch sizes summing to ``global_batch`` (see the module docstring for the policy).

    ``probe`` measures this rank's :class:`StepCost` on the real model (None: cannot probe);
    ``info`` and ``warn`` report what was measured and decided; ``on_costs`` receives every
    rank's probed cost when a probe ran (the calibrator keeps their fixed parts).
    """
    cfg.check_world_size(world_size, global_batch)
    if cfg.batch_sizes is not None:
        return list(cfg.batch_sizes)
    if cfg.capacities is not None:
        return split_batch(global_batch, cfg.capacities, cfg.max_batch_sizes)
    costs = gather_step_costs(probe() if probe is not None else None, world_size, info, warn)
    if on_costs is not None:
        on_costs(costs)
    bandwidth = profile_bandwidth(cfg.profile, world_size)
    if bandwidth is not None:
        caps = capacity([c.samples_per_s for c in costs], bandwidth, cfg.alpha, cfg.beta)
        return split_batch(global_batch, caps, cfg.max_batch_sizes)
    return split_batch_timed(global_batch, [c.samples_per_s for c in costs], [c.fixed_s for c in costs],
                             cfg.max_batch_sizes)


def probe_exchange(cfg: CompressionConfig) -> ProbeExchange:
    """What of the gradient exchange the probe times with each step, from the compression config."""
    if cfg.method in ("topk", "tiered"):
        # Top-K's encode runs on every rank at every step and is per-entry work, not per-sample: a
        # slow rank pays it slower, so the plan must count it (its payload is too small to compete).
        return ProbeExchange(dense=False, codec_density=cfg.base_density, codec_backend=cfg.compression_backend)
    # A dense exchange overlapped with backward competes with it on gloo: probe beside one.
    # Deferred (after backward) or compressed (small) exchanges leave the compute alone.
    return ProbeExchange(dense=cfg.method == "none" and cfg.overlap_comm)


def gather_step_costs(cost: StepCost | None, world_size: int, info: Say = log.info,
                      warn: Say = log.warning) -> list[StepCost]:
    """Every rank's probed cost (one all-gather); equal costs when any rank could not probe."""
    # NOTE: every rank must join the all-gather, also one that could not probe (cost None).
    rows = all_gather_floats([-1.0, 0.0] if cost is None else [cost.samples_per_s, cost.fixed_s])
    if min(row[0] for row in rows) <= 0:
        warn("hetero: could not probe the model's step on every rank; using equal shares. "
                    "Pass batch_sizes=... or capacities=... to set the split yourself.")
        return [StepCost(1.0)] * world_size
    costs = [StepCost(rate, fixed) for rate, fixed in rows]
    info("hetero: probed per rank (samples/s, fixed ms per step): "
         f"{[(round(c.samples_per_s, 1), round(1000 * c.fixed_s, 1)) for c in costs]}")
    return costs


def profile_bandwidth(path: str | None, world_size: int) -> list[float] | None:
    """Per-rank link bandwidth (Gbit/s) from a cluster profile JSON, or None without one."""
    if path is None:
        return None
    from hetero_strategy.cluster.profile import load_profile

    bandwidth = load_profile(path).bandwidth_gbit_s
    if len(bandwidth) != world_size:
        raise ConfigError(f"profile={path!r} is invalid: it describes {len(bandwidth)} ranks but the job has "
                          f"{world_size}; profile this cluster with `hetero-strategy profile --json`")
    return bandwidth
