"""``HeteroStrategy``: Lightning's DDP with capacity-sized per-rank batches and weighted reduction.

Lifecycle (each step is a small override of ``DDPStrategy``)::

    setup                 -> remember the user's use_distributed_sampler; we place samplers ourselves
    _register_ddp_hooks   -> register our comm hook on every device (Lightning does it on CUDA only)
    process_dataloader    -> train: probe/split, HeteroBatchSampler; val/test: DistributedSampler
    on_train_batch_start  -> set this rank's reduction weight b_r / G_t for the step
    optimizer_step        -> per-rank timings, metrics
    save/load_checkpoint  -> every rank's sampler and hook state (Lightning saves rank 0 only)

Example::

    import lightning as L
    import hetero_strategy  # registers strategy="hetero"

    trainer = L.Trainer(strategy="hetero", accelerator="cpu", devices=2)
    trainer = L.Trainer(strategy=hetero_strategy.HeteroStrategy(batch_sizes=[3, 13]), devices=2)
"""

from __future__ import annotations

import logging
import os
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from typing_extensions import override

from hetero_strategy.balance import HeteroBatchSampler, capacity, split_batch, split_batch_timed
from hetero_strategy.balance.online import OnlineBalancer
from hetero_strategy.balance.probe import StepCost
from hetero_strategy.config import ConfigError, HeteroConfig, field_owners
from hetero_strategy.hooks import build_comm_hook
from hetero_strategy.lightning.dataloaders import (
    distributed_eval_loader,
    hetero_train_loader,
    probe_batch,
    train_loader_batch_size,
)
from hetero_strategy.lightning.metrics import StepTimer

__all__ = ["HeteroStrategy"]

log = logging.getLogger(__name__)
_CKPT_KEY = "hetero_strategy"


class HeteroStrategy(DDPStrategy):
    """DDP for heterogeneous clusters.

    The DataLoader's ``batch_size`` B is the *mean* per-rank batch: the global batch G = B x world
    size is what plain DDP would use, split across ranks by capacity. The reduced gradient is
    sum_r b_r g_r / G, so training follows one process with batch G.

    Args:
        config: a :class:`HeteroConfig`, or the path of a YAML file holding one.
        batch_sizes: explicit per-rank batch sizes (sum = B x world size).
        capacities: relative per-rank capacities; batch sizes are split in proportion.
        alpha, beta, max_batch_sizes, probe_steps, seed, calibrate, compression: see
            :class:`HeteroConfig`; any other field of it may be passed as a keyword too.
        **kwargs: remaining keywords go to ``DDPStrategy`` / ``DistributedDataParallel``.
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
        self.hetero_config = _resolve_config(config, flat)
        _check_ddp_kwargs(kwargs)
        for name in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper"):
            if kwargs.get(name) is not None:
                raise ConfigError(f"{name}={kwargs[name]!r} is invalid with HeteroStrategy: it registers its own "
                                  "comm hook; choose a codec with compression=... instead")
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
        self.hook_state: Any = None
        self.sampler: HeteroBatchSampler | None = None
        self.balancer: OnlineBalancer | None = None
        self._local_batch = 0
        self.timer = StepTimer()
        self._use_distributed_sampler = True
        self._pending_state: dict | None = None

    # ---- registry ------------------------------------------------------------------------
    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("hetero", cls, description="Heterogeneous-cluster DDP (capacity-sized batches)")
        strategy_registry.register(
            "hetero_topk", cls, description="hetero with Top-K compression and error feedback", compression="topk"
        )
        strategy_registry.register(
            "hetero_tiered", cls, description="hetero with per-link-tier compression", compression="tiered"
        )
        strategy_registry.register(
            "hetero_spawn", cls, description="hetero with start_method='spawn'", start_method="spawn"
        )

    # ---- setup ---------------------------------------------------------------------------
    @override
    def setup(self, trainer: Any) -> None:
        # NOTE: Lightning forces shuffling of training data when it injects its DistributedSampler,
        # and the user's `shuffle` is lost by then. We switch its injection off and place the
        # samplers ourselves in process_dataloader, following the user's DataLoader.
        connector = trainer._accelerator_connector
        self._use_distributed_sampler = connector.use_distributed_sampler
        connector.use_distributed_sampler = False
        super().setup(trainer)

    @override
    def setup_environment(self) -> None:
        # Refuse per-rank lists of the wrong length before any collective could hang on them.
        self.hetero_config.balance.check_world_size(self.num_nodes * self.num_processes)
        super().setup_environment()

    @override
    def _register_ddp_hooks(self) -> None:
        # NOTE: DDPStrategy registers comm hooks only on CUDA; on CPU/gloo that would silently fall
        # back to DDP's divide-by-world-size, which is wrong for unequal batches.
        assert isinstance(self.model, DistributedDataParallel)
        self.hook_state, hook = build_comm_hook(self.hetero_config, process_group=None, trainer=self._trainer())
        self._restore_pending()
        self.model.register_comm_hook(self.hook_state, hook)

    def _trainer(self) -> Any:
        return self.lightning_module.trainer if self.lightning_module is not None else None

    # ---- data ----------------------------------------------------------------------------
    @override
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self._trainer()
        if not isinstance(dataloader, DataLoader) or trainer is None:
            return dataloader
        if trainer.state.stage == RunningStage.TRAINING:
            return self._train_loader(dataloader)
        if self._use_distributed_sampler:
            return distributed_eval_loader(dataloader, self.world_size, self.global_rank, trainer.state.stage)
        return dataloader

    def _train_loader(self, dataloader: DataLoader) -> DataLoader:
        batch = train_loader_batch_size(dataloader)
        global_batch = batch * self.world_size
        cfg = self.hetero_config.balance
        cfg.check_world_size(self.world_size, global_batch)
        sizes = self._plan_batch_sizes(dataloader, batch, global_batch)
        seed = cfg.seed if cfg.seed is not None else int(os.environ.get("PL_GLOBAL_SEED", "0"))
        loader, self.sampler = hetero_train_loader(dataloader, sizes, self.global_rank, seed)
        if self.hetero_config.calibration.calibrate:
            from hetero_strategy.balance.calibrator import Calibrator

            self.balancer = OnlineBalancer(Calibrator(self.hetero_config.calibration, sizes), self.sampler)
        self._restore_pending()
        rank_zero_info(f"hetero: global batch {global_batch} split as {self.sampler.batch_sizes} "
                       f"(shuffle={self.sampler.shuffle}, seed={seed})")
        return loader

    def _plan_batch_sizes(self, dataloader: DataLoader, batch: int, global_batch: int) -> list[int]:
        cfg = self.hetero_config.balance
        if cfg.batch_sizes is not None:
            return list(cfg.batch_sizes)
        if cfg.capacities is not None:
            return split_batch(global_batch, cfg.capacities, cfg.max_batch_sizes)
        costs = self._probe_costs(dataloader, batch)
        bandwidth = self._profile_bandwidth()
        if bandwidth is not None:
            # The documented capacity model: alpha * compute + beta * bandwidth, proportional.
            caps = capacity([c.samples_per_s for c in costs], bandwidth, cfg.alpha, cfg.beta)
            return split_batch(global_batch, caps, cfg.max_batch_sizes)
        return split_batch_timed(global_batch, [c.samples_per_s for c in costs], [c.fixed_s for c in costs],
                                 cfg.max_batch_sizes)

    def _profile_bandwidth(self) -> list[float] | None:
        path = self.hetero_config.balance.profile
        if path is None:
            return None
        from hetero_strategy.cluster.profile import load_profile

        bandwidth = load_profile(path).bandwidth_gbit_s
        if len(bandwidth) != self.world_size:
            raise ConfigError(f"profile={path!r} is invalid: it describes {len(bandwidth)} ranks but the job has "
                              f"{self.world_size}; profile this cluster with `hetero-strategy profile --json`")
        return bandwidth

    def _probe_costs(self, dataloader: DataLoader, batch: int) -> list[StepCost]:
        """Time forward+backward of the real model at B and B/2 on every rank; all-gather the costs."""
        from hetero_strategy.balance.probe import all_gather_floats
        from hetero_strategy.lightning.probe import probe_step_cost

        module = self.lightning_module
        # B and B/2, counted as the probe batches really hold them (the data may be shorter than B);
        # a single size when they coincide, so no size is timed twice.
        size = len(dataloader.dataset)
        counts = sorted({min(batch, size), min(max(1, batch // 2), size)}, reverse=True)
        batches = [(self.batch_to_device(probe_batch(dataloader, n), dataloader_idx=0), n) for n in counts]
        # A dense exchange overlapped with backward competes with it on gloo: probe beside one.
        # Deferred (after backward) or compressed (small) exchanges leave the compute alone.
        comp = self.hetero_config.compression
        with_comm = comp.method == "none" and comp.overlap_comm
        cost = probe_step_cost(module, batches, self.hetero_config.balance.probe_steps, with_comm=with_comm)
        # NOTE: every rank must join the all-gather, also one that could not probe (cost None).
        rows = all_gather_floats([-1.0, 0.0] if cost is None else [cost.samples_per_s, cost.fixed_s])
        if min(row[0] for row in rows) <= 0:
            rank_zero_warn("hetero: cannot probe a model with manual optimization; using equal shares. "
                           "Pass batch_sizes=... or capacities=... to HeteroStrategy.")
            return [StepCost(1.0)] * self.world_size
        costs = [StepCost(rate, fixed) for rate, fixed in rows]
        rank_zero_info("hetero: probed per rank (samples/s, fixed ms per step): "
                       f"{[(round(c.samples_per_s, 1), round(1000 * c.fixed_s, 1)) for c in costs]}")
        return costs

    # ---- per step ------------------------------------------------------------------------
    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        if self.sampler is not None and self.hook_state is not None:
            plan = self.sampler.next_plan() or self.sampler.plan(batch_idx)
            self._local_batch = plan.sizes[self.global_rank]
            self.hook_state.set_local_batch(self._local_batch, plan.global_batch)
        self.timer.batch_start()

    @override
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        self.timer.backward_end(getattr(self.hook_state, "last_hook_time", None))

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        self.timer.step_end()
        trainer = self._trainer()
        if trainer is not None and self.sampler is not None:
            self._after_step(trainer)
        return out

    def _after_step(self, trainer: Any) -> None:
        """Rebalance when due; log per-rank metrics at Lightning's cadence (one small all-gather each)."""
        if self.balancer is not None:
            new = self.balancer.step_end(trainer.global_step, self.timer.compute_time, self._local_batch)
            if new is not None:
                rank_zero_info(f"hetero: step {trainer.global_step}: batch sizes -> {new}")
        if (trainer.global_step % max(trainer.log_every_n_steps, 1)) != 0 or trainer.logger is None:
            return
        metrics = self.timer.gather_metrics(self._local_batch, self._hook_stats())
        self.lightning_module.log_dict(metrics, on_step=True, on_epoch=False, sync_dist=False)

    def _hook_stats(self) -> dict[str, float]:
        """The compression hook's per-rank figures of the last step (none for the dense hook)."""
        names = {"density": "density", "last_bytes_sent": "bytes_sent", "last_bytes_received": "bytes_received"}
        return {label: getattr(self.hook_state, attr) for attr, label in names.items()
                if isinstance(getattr(self.hook_state, attr, None), (int, float))}

    # ---- checkpoints ---------------------------------------------------------------------
    def hetero_state_dict(self) -> dict:
        """This rank's hetero state: sampler schedule and hook state (e.g. residuals)."""
        state: dict[str, Any] = {}
        if self.sampler is not None:
            state["sampler"] = self.sampler.state_dict()
        if self.hook_state is not None:
            state["hook"] = self.hook_state.state_dict()
        if self.balancer is not None:
            state["balancer"] = self.balancer.state_dict()
        return state

    def _restore_pending(self) -> None:
        """Apply the state load_checkpoint stashed, to whichever parts exist by now."""
        pending = self._pending_state or {}
        for key, part in (("sampler", self.sampler), ("hook", self.hook_state), ("balancer", self.balancer)):
            if part is not None and key in pending:
                part.load_state_dict(pending.pop(key))

    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        # NOTE: Lightning writes rank 0's checkpoint only; per-rank state (error-feedback
        # residuals) would be lost, so every rank's state is gathered into it first.
        mine = self.hetero_state_dict()
        if dist.is_available() and dist.is_initialized():
            gathered: list[Any] = [None] * dist.get_world_size()
            dist.all_gather_object(gathered, mine)
        else:
            gathered = [mine]
        checkpoint[_CKPT_KEY] = {"ranks": gathered, "config": self.hetero_config.to_dict()}
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        saved = checkpoint.get(_CKPT_KEY)
        if saved is not None:
            ranks = saved["ranks"]
            if len(ranks) != self.world_size:
                rank_zero_warn(f"hetero: checkpoint holds state of {len(ranks)} ranks but this job has "
                               f"{self.world_size}; batch plan and residuals start fresh")
            else:
                self._pending_state = dict(ranks[self.global_rank])
                self._restore_pending()
        return checkpoint


def _check_ddp_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse keywords neither hetero nor DDP knows, here rather than deep inside DDP's constructor."""
    import inspect

    known = set(inspect.signature(DistributedDataParallel.__init__).parameters) | set(
        inspect.signature(DDPStrategy.__init__).parameters
    )
    for key, value in kwargs.items():
        if key not in known or key in ("self", "module", "kwargs"):
            raise ConfigError(f"{key}={value!r} is invalid: unknown option; HeteroStrategy takes the fields of "
                              "HeteroConfig plus DDPStrategy/DistributedDataParallel keywords")


def _resolve_config(config: str | Path | HeteroConfig | None, flat: dict[str, Any]) -> HeteroConfig:
    if config is None:
        return HeteroConfig.from_flat(**flat)
    if isinstance(config, (str, Path)):
        return HeteroConfig.from_yaml(config).replace(**flat)
    if isinstance(config, HeteroConfig):
        return config.replace(**flat)
    raise ConfigError(f"config={config!r} is invalid: pass a HeteroConfig or the path of a YAML file")
