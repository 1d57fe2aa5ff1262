"""``HeteroRuntime``: the per-run, framework-free core that both adapters drive.

It owns everything hetero does in a run: the static plan, the batch sampler, the comm hook's
state and its per-step weight, the online calibrator, the step timer with its metrics, and the
checkpointable per-rank state. An adapter (Lightning's strategy, Accelerate's plugin) only calls
it from its framework's events::

    runtime = HeteroRuntime(config, rank, world_size)
    loader = runtime.train_loader(loader, seed=0, measure=...)  # plan + sampler (probe is collective)
    runtime.register_hook(ddp_model, max_steps=1000)           # our comm hook on the DDP model
    for batch in loader:
        runtime.batch_start()                                  # weight b_r / G of this batch
        loss(ddp_model(batch)).backward(); runtime.backward_end()
        optimizer.step(); runtime.step_end(step)               # timings, calibration
        if runtime.metrics_due(step, every=50):
            log(runtime.metrics())                             # one all-gather, every rank

It works on bare ``torch.nn.parallel.DistributedDataParallel``; nothing here imports a framework.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

from hetero_strategy.balance import HeteroBatchSampler
from hetero_strategy.balance.online import OnlineBalancer
from hetero_strategy.balance.probe import ProbeExchange, StepCost
from hetero_strategy.config import HeteroConfig
from hetero_strategy.hooks import build_comm_hook
from hetero_strategy.hybrid import HybridTraining
from hetero_strategy.precision import RankPrecision
from hetero_strategy.runtime.gate import StepGate
from hetero_strategy.runtime.hybrid_events import HybridEvents
from hetero_strategy.runtime.loaders import (
    check_sample_cost,
    hetero_train_loader,
    probe_batch,
    train_loader_batch_size,
)
from hetero_strategy.runtime.planner import plan_batch_sizes, probe_exchange
from hetero_strategy.runtime.stall import StallWatch, hook_groups
from hetero_strategy.runtime.state import RuntimeState
from hetero_strategy.runtime.timer import StepTimer

__all__ = ["HeteroRuntime"]

log = logging.getLogger("hetero_strategy")

# measure(batches, exchange) -> this rank's StepCost, or None when the model cannot be probed.
Measure = Callable[[list[tuple[Any, int]], ProbeExchange], "StepCost | None"]


class HeteroRuntime(RuntimeState, HybridEvents):
    """Plan, sampler, hook state, calibrator, timer and checkpoint state of one rank.

    Args:
        config: the run's :class:`HeteroConfig`.
        rank: this process's global rank.
        world_size: number of ranks; per-rank lists in ``config`` are checked against it here,
            before any collective could hang on them.
        info: where messages go (default: the ``hetero_strategy`` logger); called on rank 0 only.
        warn: where warnings go (default: the ``hetero_strategy`` logger).
    """

    def __init__(self, config: HeteroConfig, rank: int, world_size: int, *,
                 info: Callable[[str], None] | None = None, warn: Callable[[str], None] | None = None) -> None:
        config.balance.check_world_size(world_size)
        self.config = config
        self.rank = rank
        self.world_size = world_size
        self._info = info or log.info
        self.warn = warn or log.warning
        self.hook_state: Any = None
        self.sampler: HeteroBatchSampler | None = None
        self.balancer: OnlineBalancer | None = None
        self.timer = StepTimer()
        self.gate = StepGate(config.reliability, self.info_warning)
        self.watch: StallWatch | None = None
        self.local_batch = 0
        self.steps = 0  # optimizer steps taken (checkpointed), for adapters without a step counter
        self._batch_open = False
        self._pending: dict[str, Any] = {}
        # local-SGD phases (mode="hybrid"): the controller is set up by register_hook
        self.hybrid = HybridTraining(config.hybrid, rank, world_size, self.info, self.phase,
                                     config.reliability.stall_timeout_s) if config.hybrid.mode == "hybrid" else None

    def info(self, message: str) -> None:
        if self.rank == 0:
            self._info(message)

    def info_warning(self, message: str) -> None:
        """A warning every rank would give alike: said once, by rank 0."""
        if self.rank == 0:
            self.warn(message)

    @property
    def precision(self) -> RankPrecision | None:
        return self.gate.precision

    # ---- setup ---------------------------------------------------------------------------
    def register_hook(self, ddp_model: Any, max_steps: int | Callable[[], Any] | None = None,
                      process_group: dist.ProcessGroup | None = None) -> None:
        """Build the configured comm hook (collective for ``tiered``) and register it on ``ddp_model``.

        ``max_steps`` is the run's length for the density schedule: an int, or a callable read at
        the first compressed step (when the length is known only once the data is set up).
        """
        self.hook_state, hook = build_comm_hook(self.config, process_group, max_steps=max_steps)
        self._restore_pending()
        ddp_model.register_comm_hook(self.hook_state, self.gate.guard.wrap_hook(hook))
        if self.hybrid is not None:
            self.hybrid.attach(ddp_model)
        # Inside runtime.phase(...) no collective waits longer than stall_timeout_s, and a failed one is explained
        if self.watch is None and self.world_size > 1:
            self.watch = StallWatch(self.rank, self.world_size, self.config.reliability.stall_timeout_s,
                                    groups=hook_groups(self.hook_state))

    def phase(self, where: str) -> contextlib.AbstractContextManager:
        """``with runtime.phase("exchange"): loss.backward()``: collectives inside wait at most
        ``stall_timeout_s``, and one failing (a silent or dead peer) raises :class:`StallError`
        naming the peer, ``where`` and the step."""
        return contextlib.nullcontext() if self.watch is None else self.watch.phase(where, self.steps)

    def close(self) -> None:
        """Stop the heartbeat thread (the end of fit; a daemon thread otherwise ends with the process)."""
        if self.watch is not None:
            self.watch.close()
            self.watch = None

    def setup_precision(self, device: Any, model: Any = None, device_info: Any = None) -> RankPrecision | None:
        """This rank's dtype under ``precision_policy`` (None: the framework's own precision)."""
        if self.config.precision.precision_policy is None:
            return None
        self.gate.precision = RankPrecision.build(self.config.precision, self.rank, self.world_size, device,
                                                  device_info)
        if model is not None:
            self.precision.keep_fp32(model)
        self._restore_pending()
        return self.precision

    def train_loader(self, loader: DataLoader, *, seed: int, measure: Measure | None = None,
                     shuffle: bool | None = None, all_ranks: bool = False, accumulate: int = 1) -> DataLoader:
        """The user's training loader rebuilt with capacity-sized slices of each global batch.

        The loader's ``batch_size`` B is the mean per-rank batch (G = B x world size). Without
        explicit sizes or capacities, ``measure`` times the real model at B and B/2 on every rank
        (collective). ``all_ranks`` makes the loader yield every rank's slice in turn, for a
        framework that deals batches out to ranks itself. ``accumulate`` is the number of
        micro-batches per optimizer step: calibrated splits change only between windows.
        """
        batch = train_loader_batch_size(loader)
        check_sample_cost(self.config, accumulate)
        global_batch = batch * self.world_size
        self.config.balance.check_world_size(self.world_size, global_batch)
        probe = None if measure is None else lambda: self._probe(loader, batch, measure)
        probed: list[StepCost] = []
        sizes = plan_batch_sizes(self.config.balance, self.world_size, global_batch, probe, self.info, self.warn,
                                 on_costs=probed.extend)
        loader, self.sampler = hetero_train_loader(loader, sizes, None if all_ranks else self.rank, seed, shuffle,
                                                   self.config.balance.sample_cost,
                                                   self.config.balance.loss_normalization,
                                                   self.config.balance.max_batch_sizes)
        if self.config.calibration.calibrate:
            from hetero_strategy.balance.calibrator import Calibrator

            fixed = [accumulate * c.fixed_s for c in probed] or None  # the probe's fit, per optimizer step
            self.balancer = OnlineBalancer(Calibrator(self.config.calibration, sizes, fixed), self.sampler, accumulate)
        self._warn_partial_window(loader, global_batch, accumulate)
        self._restore_pending()
        self.info(f"hetero: global batch {global_batch} split as {self.sampler.batch_sizes} "
                  f"(shuffle={self.sampler.shuffle}, seed={seed})")
        return loader

    def _warn_partial_window(self, loader: DataLoader, global_batch: int, accumulate: int) -> None:
        if accumulate > 1 and not loader.drop_last and len(loader.dataset) % global_batch:
            self.warn(f"hetero: accumulating {accumulate} micro-batches with a partial last batch "
                      f"({len(loader.dataset)} samples, global batch {global_batch}): the window holding it is "
                      "weighted by its last micro-batch, so it is not exactly the one-process step. Use "
                      "drop_last=True, or a dataset length divisible by the global batch, for exact semantics")

    def _probe(self, loader: DataLoader, batch: int, measure: Measure) -> StepCost | None:
        # B and B/2, counted as the probe batches really hold them (the data may be shorter than B);
        # a single size when they coincide, so no size is timed twice.
        size = len(loader.dataset)
        counts = sorted({min(batch, size), min(max(1, batch // 2), size)}, reverse=True)
        return measure([(probe_batch(loader, n), n) for n in counts], probe_exchange(self.config.compression))

    # ---- per step ------------------------------------------------------------------------
    def batch_start(self, step_in_epoch: int | None = None) -> None:
        """A batch reaches the model: set this rank's weight b_r / G_t for it and start the clock.

        The plan is the oldest batch the sampler yielded and nobody has claimed (loaders fetch
        ahead); ``step_in_epoch`` is the fallback when the sampler has none queued.
        """
        self._close_batch()
        self.gate.guard.new_step()
        if self.sampler is not None:
            plan = self.sampler.next_plan()
            if plan is None and step_in_epoch is not None:
                plan = self.sampler.plan(step_in_epoch)
            if plan is not None:
                self.local_batch = plan.sizes[self.rank]
                if self.hook_state is not None:  # b_r / G_t, or this rank's loss units / the step's
                    self.hook_state.set_local_batch(*plan.weight_parts(self.rank))
        self.timer.batch_start()
        self._batch_open = True

    def backward_end(self) -> None:
        """This rank's backward pass of the current batch is over (an adapter that cannot tell
        may skip it: the next :meth:`batch_start` or :meth:`step_end` closes the batch instead)."""
        self._close_batch()

    def _close_batch(self) -> None:
        # Compute ends when the last bucket reached the hook (the rest of backward is waiting for
        # peers); on a no-sync micro-batch, now.
        if self._batch_open:
            self.timer.backward_end(getattr(self.hook_state, "last_hook_time", None))
            self._batch_open = False

    def step_end(self, step: int | None = None, samples: float | None = None) -> list[int] | None:
        """An optimizer step ended: timings, then calibration when due; in hybrid mode the period's
        sync when it is over (see :attr:`synced`).

        ``step`` numbers optimizer steps from 0 (the framework's counter); None uses the
        runtime's own count, which checkpoints carry. ``samples``: this step's samples, the
        weight of a local step in hybrid averaging (default: the sampler's batch size, else 1).
        """
        self._close_batch()
        step = self.steps if step is None else step
        self.steps = step + 1
        self.timer.step_end(getattr(self.hook_state, "last_bytes_sent", 0))
        if self.hybrid is not None:
            self.hybrid.step_end(samples if samples is not None else self.local_batch or 1)
        if self.balancer is None:
            return None
        new = self.balancer.step_end(step, self.timer.compute_time, self.local_batch, self.timer.step_time)
        if new is not None:
            self.info(f"hetero: step {step}: batch sizes -> {new}")
        return new

    def autocast(self) -> contextlib.AbstractContextManager:
        """This rank's autocast (nothing without a precision policy)."""
        return self.gate.autocast()

    def scale_loss(self, loss: Any) -> Any:
        """The loss to call backward on: scaled on fp16 ranks, as is elsewhere."""
        return self.gate.scale_loss(loss, self.hook_state)

    def check_overflow(self, params: Any) -> bool:
        """Decide now, from the reduced gradient, whether this step is skipped (before any clipping)."""
        return self.gate.check(params)

    def drop_nonfinite(self, params: Any) -> bool:
        """Without a loss scaler: clear a non-finite step's gradients (True), or stop (``nonfinite``)."""
        return self.gate.drop_nonfinite(list(params), self.steps)

    def optimizer_step(self, optimizer: Any, step_fn: Callable[[], Any] | None = None,
                       before_step: Callable[[], Any] | None = None) -> bool:
        """Step unless the reduced gradient is non-finite (then every rank skips); True if stepped.

        ``before_step`` (gradient clipping, the framework's pre-step hook) runs only if it steps.
        """
        return self.gate.step(optimizer, self.steps, step_fn, before_step)

    @staticmethod
    def metrics_due(step: int, every: int) -> bool:
        """The same answer on every rank, so all of them join :meth:`metrics`'s all-gather."""
        return step % max(every, 1) == 0

    def metrics(self) -> dict[str, float]:
        """Every rank's batch size, compute and step time, speed, balance and hook figures (collective)."""
        names = {"density": "density", "last_bytes_sent": "bytes_sent", "last_bytes_received": "bytes_received"}
        extra = {label: getattr(self.hook_state, attr) for attr, label in names.items()
                 if isinstance(getattr(self.hook_state, attr, None), (int, float))}
        out = self.timer.gather_metrics(self.local_batch, extra)
        if self.hybrid is not None:  # phase, period, the last sync's steps and weights: no collective
            out.update(self.hybrid.metrics())
        return out

    def summary(self) -> dict[str, object]:
        """The run so far: batch split, global samples/s, balance, wire bytes per step (collective)."""
        sizes = self.sampler.batch_sizes if self.sampler is not None else [self.local_batch] * self.world_size
        return self.timer.summary(sizes)

    def _parts(self) -> dict[str, Any]:
        """The checkpointed parts by key (None until built)."""
        return {"sampler": self.sampler, "hook": self.hook_state, "balancer": self.balancer,
                "scaler": None if self.precision is None else self.precision.scaler, "hybrid": self.hybrid}

    def _restore_pending(self) -> None:
        for key, part in self._parts().items():
            if part is not None and key in self._pending and part.load_state_dict(self._pending.pop(key)) is False:
                self.info_warning("hetero: the saved batch split is for another global batch; this run's split "
                                  "stands, and the epoch goes on from the same sample (within one batch)")
        if self.sampler is not None and "sampler_position" in self._pending:  # saved under another world
            self.sampler.resume_at_samples(*self._pending.pop("sampler_position"))
