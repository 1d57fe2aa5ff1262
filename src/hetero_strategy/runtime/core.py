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

It works on bare DDP, or on FSDP2 (``register_sharded``); nothing here imports a framework. It
holds its parts and forwards to them: :mod:`.state` (checkpoints), :mod:`.training_mode` (hybrid
events, no-ops in sync mode), :mod:`.gate` (precision, non-finite steps), timer, stall watch.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from typing import Any

import torch.distributed as dist
from torch.utils.data import DataLoader

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.hooks import build_comm_hook
from hetero_strategy.hooks.momentum import optimizer_momentum_warning
from hetero_strategy.hybrid import HybridTraining
from hetero_strategy.precision import RankPrecision
from hetero_strategy.runtime.fsdp import ShardedReduction
from hetero_strategy.runtime.gate import StepGate
from hetero_strategy.runtime.micro import MicroBatch, micro_batches
from hetero_strategy.runtime.planner import Measure, plan_train_loader
from hetero_strategy.runtime.stall import StallWatch, hook_groups
from hetero_strategy.runtime.state import RuntimeState
from hetero_strategy.runtime.timer import StepTimer
from hetero_strategy.runtime.training_mode import SyncTraining, TrainingEvents, TrainingMode

__all__ = ["HeteroRuntime"]

log = logging.getLogger("hetero_strategy")


class HeteroRuntime(TrainingEvents):
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
        self.config, self.rank, self.world_size = config, rank, world_size
        self._info, self.warn = info or log.info, warn or log.warning
        self.state = RuntimeState(config, rank, world_size, warn=self.warn, info_warning=self.info_warning)
        self.timer = StepTimer()
        self.gate = StepGate(config.reliability, self.info_warning)
        self.watch: StallWatch | None = None
        self.local_batch = 0
        self._batch_open = False
        self.training: TrainingMode = SyncTraining()  # DDP every step, or local-SGD phases:
        if config.hybrid.mode == "hybrid":  # the controller is set up on the DDP model by register_hook
            self.training = hybrid = HybridTraining(config.hybrid, rank, world_size, self.info, self.phase,
                                                    config.reliability.stall_timeout_s)
            self.state.attach(hybrid=hybrid)

    def info(self, message: str) -> None:
        if self.rank == 0:
            self._info(message)

    def info_warning(self, message: str) -> None:
        """A warning every rank would give alike: said once, by rank 0."""
        if self.rank == 0:
            self.warn(message)

    # ---- the parts, built over the run (the checkpointed ones and the step count: self.state) ------
    hybrid = property(lambda self: self.state.parts["hybrid"], doc="HybridTraining (mode='hybrid'), else None.")
    sampler = property(lambda self: self.state.parts["sampler"], doc="The batch sampler (train_loader).")
    hook_state = property(lambda self: self.state.parts["hook"], doc="The comm hook's state (register_hook).")
    balancer = property(lambda self: self.state.parts["balancer"], doc="The online calibration (calibrate).")
    precision = property(lambda self: self.gate.precision, doc="This rank's RankPrecision (precision_policy).")
    steps = property(lambda self: self.state.steps, doc="Optimizer steps taken (checkpointed), for adapters.")

    # ---- setup ---------------------------------------------------------------------------
    def register_hook(self, ddp_model: Any, max_steps: int | Callable[[], Any] | None = None,
                      process_group: dist.ProcessGroup | None = None) -> None:
        """Build the configured comm hook (collective for ``tiered``) and register it on ``ddp_model``.

        ``max_steps`` is the run's length for the density schedule: an int, or a callable read at
        the first compressed step (when the length is known only once the data is set up).
        """
        hook_state, hook = build_comm_hook(self.config, process_group, max_steps=max_steps, model=ddp_model,
                                           announce=self._info)
        self.state.attach(hook=hook_state)
        ddp_model.register_comm_hook(hook_state, self.gate.guard.wrap_hook(hook))
        self.training.attach(ddp_model)
        self._watch(hook_groups(hook_state))

    def register_sharded(self, fsdp_modules: list[Any]) -> ShardedReduction:
        """FSDP2 in place of DDP: a summed reduce-scatter, and the weight b_r / G_t the adapter puts on the
        loss (``reduction.weigh(loss)``); set at every :meth:`batch_start`, like the DDP hook's."""
        reduction = ShardedReduction(fsdp_modules, self.world_size, self.config.balance.max_batch_sizes is not None)
        self.state.attach(hook=reduction)
        self._watch([])
        return reduction

    def _watch(self, groups: list[Any]) -> None:
        # Inside runtime.phase(...) no collective waits longer than stall_timeout_s, and a failed one is explained
        if self.watch is None and self.world_size > 1:
            self.watch = StallWatch(self.rank, self.world_size, self.config.reliability.stall_timeout_s, groups=groups)

    def phase(self, where: str) -> contextlib.AbstractContextManager:
        """``with runtime.phase("exchange"): loss.backward()``: collectives inside wait at most
        ``stall_timeout_s``; one failing (a silent or dead peer) raises :class:`StallError`."""
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
        self.gate.setup_precision(self.config.precision, self.rank, self.world_size, device, model, device_info)
        self.state.attach(scaler=self.precision.scaler)
        return self.precision

    def train_loader(self, loader: DataLoader, *, seed: int, measure: Measure | None = None,
                     shuffle: bool | None = None, all_ranks: bool = False, accumulate: int = 1) -> DataLoader:
        """The user's training loader rebuilt with capacity-sized slices of each global batch.

        The loader's ``batch_size`` B is the mean per-rank batch (G = B x world size). Without
        explicit sizes or capacities, ``measure`` times the real model at B and B/2 on every rank
        (collective). ``all_ranks``: yield every rank's slice in turn, for a framework that deals
        batches out itself. ``accumulate``: micro-batches per optimizer step (calibrated splits
        change only between windows)."""
        if measure is not None and isinstance(self.hook_state, ShardedReduction):
            measure = self.hook_state.probe(measure)
        planned = plan_train_loader(self.config, self.rank, self.world_size, loader, seed=seed, measure=measure,
                                    shuffle=shuffle, all_ranks=all_ranks, accumulate=accumulate, info=self.info,
                                    warn=self.info_warning)  # the plan's warnings: every rank alike, said once
        self.state.attach(sampler=planned.sampler, balancer=planned.balancer)
        self.state.memory_caps, self.state.memory_probe = planned.memory_caps, planned.memory  # in the run record
        if planned.memory_caps is not None and isinstance(self.hook_state, ShardedReduction):
            self.hook_state.keep_gathered()  # every rank alike: the caps are all-gathered
        sampler = planned.sampler
        self.info(f"hetero: global batch {sampler.global_batch} split as {sampler.batch_sizes} "
                  f"(shuffle={sampler.shuffle}, seed={seed})")
        return planned.loader

    # ---- per step ------------------------------------------------------------------------
    def batch_start(self, step_in_epoch: int | None = None) -> None:
        """A batch reaches the model: set this rank's weight b_r / G_t for it and start the clock. The
        plan is the oldest batch the sampler yielded and nobody claimed (loaders fetch ahead);
        ``step_in_epoch`` is the fallback when the sampler has none queued."""
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
        """This rank's backward is over (optional: the next batch_start or step_end closes the batch)."""
        self._close_batch()

    def _close_batch(self) -> None:
        # Compute ends when the last bucket reached the hook (the rest is waiting); no-sync: now.
        if self._batch_open:
            self.timer.backward_end(self.hook_state)
            self._batch_open = False

    def step_end(self, step: int | None = None, samples: float | None = None) -> list[int] | None:
        """An optimizer step ended: timings, calibration when due, the hybrid period's sync when over.

        ``step`` numbers optimizer steps from 0 (the framework's counter; None: the runtime's own,
        which checkpoints carry). ``samples`` weighs a local step in hybrid averaging (default: the
        sampler's batch size, else 1)."""
        self._close_batch()
        step = self.steps if step is None else step
        self.state.steps = step + 1
        self.timer.step_end(getattr(self.hook_state, "last_bytes_sent", 0))
        self.training.step_end(samples if samples is not None else self.local_batch or 1)
        if self.balancer is None:
            return None
        t = self.timer
        new = self.balancer.step_end(step, t.compute_time, self.local_batch, t.step_time, t.after_cpu, t.pace)
        if new is not None:
            self.info(f"hetero: step {step}: batch sizes -> {new}")
        return new

    @property
    def pass_cap(self) -> int | None:
        """This rank's per-pass memory cap: its ``max_batch_sizes`` entry, else the probe's (None: no cap)."""
        caps = self.config.balance.max_batch_sizes or self.state.memory_caps  # no plan (local_batch 0): one pass
        return caps[self.rank] if caps and self.local_batch else None

    def micro_batches(self, batch: Any, model: Any) -> Iterator[tuple[MicroBatch, Any]]:
        """This rank's batch as passes of at most :attr:`pass_cap`, each with its loss weight n_i / b_r
        and the context its forward and backward run in (no gradient sync but for the last)."""
        cap = self.pass_cap
        if cap is not None and self.local_batch > cap and self.config.balance.loss_normalization == "tokens":
            raise ConfigError(f"max_batch_sizes cap {cap} is invalid with loss_normalization='tokens': a pass's "
                              "weight would need its token count; raise the cap to the share, or normalise by samples")
        return micro_batches(batch, self.local_batch, cap, model)

    def autocast(self) -> contextlib.AbstractContextManager:
        """This rank's autocast (nothing without a precision policy)."""
        return self.gate.autocast()

    def scale_loss(self, loss: Any) -> Any:
        """The loss to call backward on: x b_r / G_t under FSDP2 (register_sharded); scaled on fp16 ranks."""
        if isinstance(self.hook_state, ShardedReduction):
            loss = self.hook_state.weigh(loss)
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
        ``before_step`` (gradient clipping, the framework's pre-step hook) runs only if it steps."""
        return self.gate.step(optimizer, self.steps, step_fn, before_step)

    @staticmethod
    def metrics_due(step: int, every: int) -> bool:
        """The same answer on every rank, so all of them join :meth:`metrics`'s all-gather."""
        return step % max(every, 1) == 0

    def metrics(self) -> dict[str, float]:
        """Every rank's batch size, compute and step time, speed, balance and hook figures (collective)."""
        names = {"density": "density", "last_bytes_sent": "bytes_sent", "last_bytes_received": "bytes_received",
                 "auto_predicted_ms": "auto_predicted_ms"}
        extra = {label: getattr(self.hook_state, attr) for attr, label in names.items()
                 if isinstance(getattr(self.hook_state, attr, None), (int, float))}
        # hybrid: phase, period, the last sync's steps and weights (no collective)
        return {**self.timer.gather_metrics(self.local_batch, extra), **self.training.metrics()}

    def summary(self) -> dict[str, object]:
        """The run so far: batch split, global samples/s, balance, wire bytes per step (collective)."""
        sizes = self.sampler.batch_sizes if self.sampler is not None else [self.local_batch] * self.world_size
        return self.timer.summary(sizes)

    # ---- the hybrid mode's events: TrainingEvents (runtime/training_mode.py); and this one ------
    def check_local_clipping(self, optimizers: Any, loss_scaled: bool) -> None:
        """Once the optimizers exist: refuse local clipping on still-scaled gradients (collective in hybrid
        mode); warn about an optimizer's momentum beside the hook's (``momentum_correction``)."""
        self.training.check_local_clipping(optimizers, loss_scaled)
        if message := optimizer_momentum_warning(self.config.compression.momentum_correction, optimizers):
            self.info_warning(message)

    # ---- checkpoints: this rank's RuntimeState (runtime/state.py documents each) ------------------
    def state_dict(self) -> dict[str, Any]:
        return self.state.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.state.load_state_dict(state)

    def continue_from(self, previous: HeteroRuntime | None) -> None:
        """Go on from this rank's runtime of an earlier run of the same model (Lightning's first fit)."""
        self.state.continue_from(None if previous is None else previous.state)

    def gathered_state_dict(self, optimizer_states: Any = None) -> dict[str, Any]:
        """Every rank's :meth:`state_dict` on rank 0 (collective), for a checkpoint rank 0 writes."""
        return self.state.gathered(optimizer_states)

    def load_gathered_state_dict(self, saved: dict[str, Any]) -> bool:
        return self.state.load_gathered(saved)

    def own_optimizer_states(self, saved: dict[str, Any]) -> Any:
        return self.state.own_optimizer_states(saved)
