"""``HeteroStrategy``: Lightning's DDP with capacity-sized per-rank batches and weighted reduction.

Lifecycle (each step is a small override of ``DDPStrategy``)::

    setup_environment     -> the runtime (a later run of the Trainer's model goes on from the earlier
                             one's), and this rank's dtype under precision_policy
    setup                 -> remember the user's use_distributed_sampler; we place samplers ourselves
    _register_ddp_hooks   -> register our comm hook on every device (Lightning does it on CUDA only)
    process_dataloader    -> train: probe/split, HeteroBatchSampler; val/test: DistributedSampler
    on_train_batch_start  -> set this rank's reduction weight b_r / G_t for the step
    training_step/backward-> a timed-out collective becomes a StallError naming peer, phase, step
    optimizer_step        -> the non-finite rule, per-rank timings, metrics; in mode="hybrid" the
                             local step (no_sync), the period's sync, join at the epoch's end
    setup (mode="hybrid") -> HybridCallback first in trainer.callbacks: local clipping after fp16 unscaling,
                             the phase schedule at validation end (before ModelCheckpoint saves)
    save/load_checkpoint  -> every rank's sampler and hook state: gathered into Lightning's file, or
                             each rank's own shard, asynchronously (state_dict_type="sharded")

Example::

    import lightning as L
    import hetero_strategy  # registers strategy="hetero"

    trainer = L.Trainer(strategy="hetero", accelerator="cpu", devices=2)
    trainer = L.Trainer(strategy=hetero_strategy.HeteroStrategy(batch_sizes=[3, 13]), devices=2)
"""

from __future__ import annotations

import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from typing_extensions import override

from hetero_strategy.balance import HeteroBatchSampler
from hetero_strategy.balance.online import OnlineBalancer
from hetero_strategy.balance.probe import ProbeExchange, StepCost
from hetero_strategy.config import ConfigError, HeteroConfig, field_owners
from hetero_strategy.lightning.checkpoints import CheckpointFormats, check_state_dict_type
from hetero_strategy.lightning.dataloaders import (
    distributed_eval_loader,
    lightning_is_shuffled,
    take_over_samplers,
)
from hetero_strategy.lightning.environment import allow_uneven_nodes, job_world_size
from hetero_strategy.lightning.hybrid import HybridLoop, check_hybrid_monitor
from hetero_strategy.lightning.options import (
    check_checkpoint_dir,
    check_ddp_kwargs,
    dropping_nonfinite,
    max_steps_of,
)
from hetero_strategy.lightning.probe import probe_lightning_module
from hetero_strategy.lightning.runs import Owner, carried_runtime
from hetero_strategy.runtime import HeteroRuntime, StepTimer

__all__ = ["HeteroStrategy"]


class HeteroStrategy(CheckpointFormats, HybridLoop, DDPStrategy):
    """DDP for heterogeneous clusters.

    The DataLoader's ``batch_size`` B is the *mean* per-rank batch: the global batch G = B x world
    size is what plain DDP would use, split across ranks by capacity. The reduced gradient is
    sum_r b_r g_r / G, so training follows one process with batch G.

    ``accelerator``, ``parallel_devices``, ``cluster_environment``, ``checkpoint_io``,
    ``precision_plugin``, ``process_group_backend``, ``timeout`` and ``start_method`` are
    Lightning's ``DDPStrategy`` arguments.

    Args:
        config: a :class:`HeteroConfig`, or the path of a YAML file holding one.
        batch_sizes: explicit per-rank batch sizes (sum = B x world size).
        capacities: relative per-rank capacities; batch sizes are split in proportion.
        alpha: weight of measured compute in a rank's capacity (see :class:`HeteroConfig`).
        beta: weight of measured bandwidth in a rank's capacity.
        max_batch_sizes: per-rank memory caps on the batch size.
        probe_steps: timed steps per batch size in the start-up probe.
        seed: the sampler's shuffle seed (default: 0).
        calibrate: keep moving the batch shares toward equal finishing times while training.
        compression: the comm hook: none, topk, tiered, onebit, fp16, bf16 or powersgd.
        precision_policy: per-rank autocast dtype: "auto", one dtype name, a per-rank list or a mapping.
        state_dict_type: "full" (Lightning's single checkpoint file, written by rank 0) or "sharded"
            (a directory: every rank writes its own shard asynchronously; see docs/reliability.md).
        hybrid_monitor: with ``mode="hybrid"``, the key ``validation_step`` logs whose value (mean
            over ranks) feeds the phase schedule at every validation end (docs/hybrid.md).
        **kwargs: any other field of :class:`HeteroConfig` (``tiers``, ``pipeline_stages`` ...);
            the remaining keywords go to ``DDPStrategy`` / ``DistributedDataParallel``.
    """

    strategy_name = "hetero"

    def __init__(
        self,
        config: str | Path | HeteroConfig | None = None,
        *,
        batch_sizes: list[int] | None = None,
        capacities: list[float] | None = None,
        alpha: float | None = None,
        beta: float | None = None,
        max_batch_sizes: list[int] | None = None,
        probe_steps: int | None = None,
        seed: int | None = None,
        calibrate: bool | None = None,
        compression: str | None = None,
        precision_policy: str | list[str] | dict[str, str] | None = None,
        state_dict_type: str = "full",
        hybrid_monitor: str = "val_loss",
        accelerator: Any = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: Any = None,
        checkpoint_io: Any = None,
        precision_plugin: Any = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
        start_method: str = "popen",
        **kwargs: Any,
    ) -> None:
        owners = field_owners()
        flat = {k: v for k, v in locals().items() if k in owners and v is not None}
        flat.update({k: kwargs.pop(k) for k in list(kwargs) if k in owners})
        if compression is not None:
            flat["compression"] = compression
        self.hetero_config = HeteroConfig.resolve(config, flat)
        check_ddp_kwargs(kwargs)
        check_checkpoint_dir(self.hetero_config)
        check_state_dict_type(state_dict_type)
        self.state_dict_type = state_dict_type
        check_hybrid_monitor(hybrid_monitor)
        self.hybrid_monitor = hybrid_monitor
        for name in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper"):
            if kwargs.get(name) is not None:
                raise ConfigError(f"{name}={kwargs[name]!r} is invalid with HeteroStrategy: it registers its own "
                                  "comm hook; choose a codec with compression=... instead")
        if self.hetero_config.precision.precision_policy is not None:
            if precision_plugin is not None:
                raise ConfigError(f"precision_plugin={precision_plugin!r} is invalid with precision_policy="
                                  f"{self.hetero_config.precision.precision_policy!r}: the policy installs its own "
                                  "plugin; drop one of them")
            from hetero_strategy.lightning.precision import HeteroPrecision

            precision_plugin = HeteroPrecision(lambda: self.runtime)
        # Gradients as views into DDP's buckets: no copy of the whole gradient into the buckets
        # and back each step (measurable on a slow device). Pass False to get DDP's default back.
        kwargs.setdefault("gradient_as_bucket_view", True)
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )
        self._runtime: HeteroRuntime | None = None
        self._owner: Owner | None = None  # (trainer, module) of the last run
        self._use_distributed_sampler = True

    # ---- registry ------------------------------------------------------------------------
    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        for name, description, options in (
                ("hetero", "Heterogeneous-cluster DDP (capacity-sized batches)", {}),
                ("hetero_topk", "hetero with Top-K compression and error feedback", {"compression": "topk"}),
                ("hetero_tiered", "hetero with per-link-tier compression", {"compression": "tiered"}),
                ("hetero_spawn", "hetero with start_method='spawn'", {"start_method": "spawn"})):
            strategy_registry.register(name, cls, description=description, **options)

    # ---- the framework-free core (see hetero_strategy.runtime) ----------------------------
    @property
    def runtime(self) -> HeteroRuntime:
        if self._runtime is None:
            raise RuntimeError("HeteroStrategy.runtime exists once the strategy's environment is set up")
        return self._runtime

    @property
    def hook_state(self) -> Any:
        return None if self._runtime is None else self._runtime.hook_state

    @property
    def sampler(self) -> HeteroBatchSampler | None:
        return None if self._runtime is None else self._runtime.sampler

    @property
    def balancer(self) -> OnlineBalancer | None:
        return None if self._runtime is None else self._runtime.balancer

    @property
    def timer(self) -> StepTimer | None:
        return None if self._runtime is None else self._runtime.timer

    # ---- setup ---------------------------------------------------------------------------
    @override
    def setup(self, trainer: Any) -> None:
        self._use_distributed_sampler = take_over_samplers(trainer)  # placed in process_dataloader
        connector = trainer._accelerator_connector
        policy = self.hetero_config.precision.precision_policy
        if policy is not None and connector._precision_flag != "32-true":
            # NOTE: Lightning would silently ignore Trainer(precision=...) beside our plugin
            raise ConfigError(f"Trainer(precision={connector._precision_flag!r}) conflicts with precision_policy="
                              f"{policy!r}: the policy picks each rank's dtype; drop Trainer's precision "
                              "(or drop precision_policy to let Lightning decide)")
        if self.runtime.precision is not None:
            self.runtime.precision.keep_fp32(trainer.lightning_module)
        self.setup_hybrid(trainer)
        super().setup(trainer)
        # the optimizers exist from here; Lightning's fp16 plugin holds a GradScaler
        self.runtime.check_local_clipping(self.optimizers, getattr(self.precision_plugin, "scaler", None) is not None)

    @override
    def _configure_launcher(self) -> None:
        self.cluster_environment = allow_uneven_nodes(self.cluster_environment)  # nodes may differ in size
        super()._configure_launcher()

    @override
    def setup_environment(self) -> None:
        # Refuse per-rank lists of the wrong length before any collective could hang on them.
        self.hetero_config.balance.check_world_size(
            job_world_size(self.cluster_environment, self.num_nodes, self.num_processes))
        super().setup_environment()
        # a Trainer's earlier run of this model (fit, then fit again or test) goes on from there
        previous, self._owner = carried_runtime(self._runtime, self._owner, self.lightning_module)
        self._runtime = HeteroRuntime(self.hetero_config, self.global_rank, self.world_size,
                                      info=rank_zero_info, warn=rank_zero_warn)
        self._runtime.setup_precision(self.root_device)
        self._runtime.continue_from(previous)

    @override
    def _register_ddp_hooks(self) -> None:
        # NOTE: DDPStrategy registers comm hooks only on CUDA; on CPU/gloo that would silently fall
        # back to DDP's divide-by-world-size, which is wrong for unequal batches.
        assert isinstance(self.model, DistributedDataParallel)
        self.runtime.register_hook(self.model, max_steps=max_steps_of(self._trainer()))

    def _trainer(self) -> Any:
        return self.lightning_module.trainer if self.lightning_module is not None else None

    # ---- data ----------------------------------------------------------------------------
    @override
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self._trainer()
        if not isinstance(dataloader, DataLoader) or trainer is None:
            return dataloader
        if trainer.state.stage == RunningStage.TRAINING:
            cfg = self.hetero_config.balance
            seed = cfg.seed if cfg.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", "0"))
            return self.runtime.train_loader(dataloader, seed=seed, measure=self._measure,
                                             shuffle=lightning_is_shuffled(dataloader),
                                             accumulate=trainer.accumulate_grad_batches)
        if self._use_distributed_sampler and trainer.state.stage != RunningStage.PREDICTING:  # Lightning's own
            return distributed_eval_loader(dataloader, self.world_size, self.global_rank, trainer.state.stage)
        return dataloader

    def _measure(self, batches: list[tuple[Any, int]], exchange: ProbeExchange) -> StepCost | None:
        """The probe of the real model's training_step, batches moved to this rank's device."""
        on_device = [(self.batch_to_device(b, dataloader_idx=0), n) for b, n in batches]
        with self.runtime.autocast():  # timed in the dtype this rank will train in
            return probe_lightning_module(self.lightning_module, on_device, self.hetero_config.balance.probe_steps,
                                          exchange=exchange)

    # ---- per step ------------------------------------------------------------------------
    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        self.runtime.batch_start(step_in_epoch=batch_idx)

    @override
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        self.runtime.backward_end()

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.runtime.phase("forward"):  # DDP's forward may sync buffers: a collective
            return super().training_step(*args, **kwargs)

    @override
    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.runtime.phase("exchange"):  # the comm hook's exchange runs inside backward
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.runtime.precision is None and getattr(self.precision_plugin, "scaler", None) is None:
            closure = dropping_nonfinite(closure, optimizer, self.runtime)  # a GradScaler decides itself
        out = super().optimizer_step(optimizer, self.hybrid_closure(closure), model, **kwargs)
        trainer = self._trainer()
        self.runtime.step_end(trainer.global_step if trainer is not None else None)
        self._log_metrics(trainer)
        self.hybrid_step_end(trainer)
        return out

    def _log_metrics(self, trainer: Any) -> None:
        # Lightning's logging cadence, at points every rank reaches alike, so all join the all-gather.
        if (trainer is not None and self.sampler is not None and trainer.logger is not None
                and self.runtime.metrics_point(trainer.global_step, trainer.log_every_n_steps)):
            with self.runtime.phase("metrics"):
                metrics = self.runtime.metrics()
            self.lightning_module.log_dict(metrics, on_step=True, on_epoch=False, sync_dist=False)

    @override
    def teardown(self) -> None:
        self.close_checkpoints()
        if self._runtime is not None:
            self._runtime.close()
        super().teardown()
