"""``HeteroFabricStrategy``: Fabric's DDP with capacity-sized per-rank batches and weighted reduction.

Each Fabric event forwards to the run's :class:`~hetero_strategy.runtime.HeteroRuntime` (the same
core as ``HeteroStrategy`` and ``HeteroPlugin``); nothing here plans or decides::

    setup_environment     -> the runtime, and this rank's dtype under precision_policy
    fabric.setup          -> DDP with our comm hook (Fabric's DDP registers none), on every device
    setup_dataloaders     -> the first loader is the training one: probe/split, HeteroBatchSampler,
                             each batch's plan claimed as it reaches the loop; later loaders get
                             Fabric's DistributedSampler
    fabric.backward       -> the loss scaled on fp16 ranks, the exchange bounded by stall_timeout_s,
                             the overflow decision taken from the reduced gradient
    optimizer.step        -> the non-finite rule / coordinated scaler, timings, calibration
    fabric.save / load    -> every rank's hetero state in Fabric's file (fabric/checkpoints.py)
"""

from __future__ import annotations

import os
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import DDPStrategy
from lightning.fabric.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader
from typing_extensions import override

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.fabric.checkpoints import TakingHeteroState, with_hetero_state
from hetero_strategy.fabric.options import fabric_config
from hetero_strategy.fabric.precision import policy_precision
from hetero_strategy.runtime import HeteroRuntime
from hetero_strategy.runtime.loaders import claiming_loader
from hetero_strategy.runtime.model_probe import LossFn, module_measure

__all__ = ["HeteroFabricStrategy"]


class HeteroFabricStrategy(DDPStrategy):
    """DDP for heterogeneous clusters, for Lightning Fabric.

    The training DataLoader's ``batch_size`` B is the *mean* per-rank batch: the global batch
    G = B x world size is what plain DDP would use, split across ranks by capacity, and the reduced
    gradient is sum_r b_r g_r / G, so training follows one process with batch G.

    Example (``fabric run --accelerator cpu --devices 2 train.py``, or ``torchrun``)::

        import hetero_strategy  # registers strategy="hetero" with Fabric
        from lightning.fabric import Fabric

        fabric = Fabric(strategy=hetero_strategy.HeteroFabricStrategy(batch_sizes=[3, 13]), devices=2)
        fabric.launch()
        model, optimizer = fabric.setup(model, optimizer)   # before the loader: the probe times the model
        loader = fabric.setup_dataloaders(DataLoader(data, batch_size=8, shuffle=True))
        for x, y in loader:                                 # each rank gets its own batch size
            fabric.backward(loss_fn(model(x), y)); optimizer.step(); optimizer.zero_grad()

    Args:
        config: a :class:`HeteroConfig`, or the path of a YAML file holding one.
        batch_sizes: explicit per-rank batch sizes (sum = B x world size).
        capacities: relative per-rank capacities; batch sizes are split in proportion.
        alpha: weight of measured compute in a rank's capacity (see :class:`HeteroConfig`).
        beta: weight of measured bandwidth in a rank's capacity.
        max_batch_sizes: refused here: a share above its cap needs passes a Fabric loop does not run.
        probe_steps: timed steps per batch size in the start-up probe.
        seed: the sampler's shuffle seed (default: ``fabric.seed_everything``'s, else 0).
        calibrate: keep moving the batch shares toward equal finishing times while training.
        compression: the comm hook: none, topk, topk_allreduce, tiered, onebit, fp16, bf16, powersgd or auto.
        precision_policy: per-rank autocast dtype: "auto", one dtype name, a per-rank list or a mapping.
        loss_fn: ``loss_fn(model, batch)``, what the start-up probe times when neither batch sizes
            nor capacities are given (default: ``hetero_strategy.runtime.model_probe.default_loss``).
        max_steps: the run's length in optimizer steps, the compression density schedule's period.
        **kwargs: any other field of :class:`HeteroConfig` (``tiers``, ``stall_timeout_s`` ...); the
            remaining keywords go to Fabric's ``DDPStrategy`` / ``DistributedDataParallel``.
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
        loss_fn: LossFn | None = None,
        max_steps: int | None = None,
        # Fabric's DDPStrategy arguments
        accelerator: Any = None, parallel_devices: list[torch.device] | None = None, cluster_environment: Any = None,
        checkpoint_io: Any = None, precision: Any = None, process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout, start_method: str = "popen",
        **kwargs: Any,
    ) -> None:
        self.hetero_config = fabric_config(config, dict(locals()), kwargs)  # pops config fields from kwargs
        precision = policy_precision(self.hetero_config.precision.precision_policy, precision, lambda: self.runtime)
        kwargs.setdefault("gradient_as_bucket_view", True)  # as HeteroStrategy: no copy into the buckets and back
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io, precision=precision,
                         process_group_backend=process_group_backend, timeout=timeout, start_method=start_method,
                         **kwargs)
        self._loss_fn, self._max_steps = loss_fn, max_steps
        self._runtime: HeteroRuntime | None = None
        self._module: torch.nn.Module | None = None  # the bare model: the probe times it
        self._ddp: DistributedDataParallel | None = None
        self._train_placed = False  # the first loader set up is the training loader

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        for name, description, options in (
                ("hetero", "Heterogeneous-cluster DDP (capacity-sized batches)", {}),
                ("hetero_topk", "hetero with Top-K compression and error feedback", {"compression": "topk"}),
                ("hetero_topk_allreduce", "hetero, Top-K at shared indices", {"compression": "topk_allreduce"}),
                ("hetero_auto", "hetero, codec chosen by measurement", {"compression": "auto"}),
                ("hetero_tiered", "hetero with per-link-tier compression", {"compression": "tiered"}),
                ("hetero_spawn", "hetero with start_method='spawn'", {"start_method": "spawn"})):
            strategy_registry.register(name, cls, description=description, **options)

    # ---- the framework-free core ----------------------------------------------------------
    @property
    def runtime(self) -> HeteroRuntime:
        if self._runtime is None:
            raise RuntimeError("HeteroFabricStrategy.runtime exists once fabric.launch() has set up the environment")
        return self._runtime

    @property
    def hook_state(self) -> Any:
        return None if self._runtime is None else self._runtime.hook_state

    @property
    def sampler(self) -> Any:
        return None if self._runtime is None else self._runtime.sampler

    def metrics(self) -> dict[str, float]:
        """Every rank's batch size, times, speed, balance and hook figures (collective: call it on every
        rank at the same step, e.g. ``fabric.log_dict(fabric.strategy.metrics())``)."""
        with self.runtime.phase("metrics"):
            return self.runtime.metrics()

    def summary(self) -> dict[str, Any]:
        """The run so far: batch split, global samples/s, balance, wire bytes per step (collective)."""
        return self.runtime.summary()

    # ---- setup ---------------------------------------------------------------------------
    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self._runtime is None:  # NOTE: Fabric's CLI path sets up in Fabric() and again in launch()
            self._runtime = HeteroRuntime(self.hetero_config, self.global_rank, self.world_size,
                                          info=rank_zero_info, warn=rank_zero_warn)
            self._runtime.setup_precision(self.root_device)

    @override
    def setup_module(self, module: torch.nn.Module) -> DistributedDataParallel:
        if self._ddp is not None:
            raise ConfigError(f"fabric.setup({type(module).__name__}) is invalid with HeteroFabricStrategy: it "
                              f"already set up {type(self._module).__name__}, and one comm hook weights one model's "
                              "gradients; set up one model per Fabric")
        ddp = super().setup_module(module)
        # NOTE: Fabric's DDP registers no comm hook: without ours DDP would divide by the world size,
        # which is wrong for unequal batches
        self.runtime.register_hook(ddp, max_steps=self._max_steps)
        if self.runtime.precision is not None:
            self.runtime.precision.keep_fp32(module)
        self._module, self._ddp = module, ddp
        return ddp

    @override
    def setup_module_and_optimizers(self, module: torch.nn.Module, optimizers: list[Any], scheduler: Any = None
                                    ) -> tuple[Any, list[Any], Any]:
        out = super().setup_module_and_optimizers(module, optimizers, scheduler)
        self.runtime.check_local_clipping(optimizers, self._scaler() is not None)
        return out

    @property
    @override
    def distributed_sampler_kwargs(self) -> dict[str, Any] | None:
        # NOTE: None until the training loader is placed, so Fabric leaves its sampler to hetero;
        # later (evaluation) loaders get Fabric's DistributedSampler
        return super().distributed_sampler_kwargs if self._train_placed else None

    @override
    def process_dataloader(self, dataloader: DataLoader) -> DataLoader:
        if self._train_placed or not isinstance(dataloader, DataLoader):
            return dataloader
        self._train_placed = True
        measure = None
        if self._module is not None:
            measure = module_measure(self.runtime, self._module, loss_fn=self._loss_fn,
                                     to_device=lambda b: self.batch_to_device(b),
                                     context=self.precision.forward_context,
                                     hint="pass HeteroFabricStrategy(loss_fn=lambda model, batch: ...), "
                                          "or batch_sizes=/capacities=")
        seed = self.hetero_config.balance.seed
        seed = seed if seed is not None else int(os.environ.get("PL_GLOBAL_SEED", "0"))  # fabric.seed_everything's
        loader = self.runtime.train_loader(dataloader, seed=seed, measure=measure)
        return claiming_loader(loader, self.runtime.batch_start)

    # ---- per step ------------------------------------------------------------------------
    @override
    def backward(self, tensor: torch.Tensor, module: Any, *args: Any, **kwargs: Any) -> None:
        tensor = self.runtime.scale_loss(tensor)  # fp16 ranks; the hook unscales their gradients
        with self.runtime.phase("exchange"):  # the comm hook's exchange runs inside backward
            super().backward(tensor, module, *args, **kwargs)
        self.runtime.backward_end()
        synced = self._ddp is not None and self._ddp.require_backward_grad_sync  # False in no_backward_sync
        if synced and self._gates():  # decided before fabric.clip_gradients could hide an inf
            self.runtime.check_overflow(self._ddp.parameters())

    @override
    def optimizer_step(self, optimizer: Any, **kwargs: Any) -> Any:
        out: list[Any] = [None]

        def step() -> None:
            out[0] = DDPStrategy.optimizer_step(self, optimizer, **kwargs)

        if self._gates():
            self.runtime.optimizer_step(optimizer, step)  # every rank steps or skips alike
        else:
            step()  # Fabric's GradScaler (precision="16-mixed") decides itself
        self.runtime.step_end()
        return out[0]

    def _scaler(self) -> Any:
        return getattr(self.precision, "scaler", None)

    def _gates(self) -> bool:
        """Whether hetero decides if a step goes ahead: not when Fabric's GradScaler does."""
        return self.runtime.precision is not None or self._scaler() is None

    # ---- checkpoints ---------------------------------------------------------------------
    @override
    def save_checkpoint(self, path: Any, state: dict[str, Any], storage_options: Any = None,
                        filter: dict[str, Callable[[str, Any], bool]] | None = None) -> None:
        super().save_checkpoint(path, with_hetero_state(state, self.runtime), storage_options, filter)

    @override
    def load_checkpoint(self, path: Any, state: Any = None, strict: bool = True,
                        weights_only: bool | None = None) -> dict[str, Any]:
        io = self.checkpoint_io
        self.checkpoint_io = TakingHeteroState(io, self.runtime)
        try:
            return super().load_checkpoint(path, state, strict=strict, weights_only=weights_only)
        finally:
            self.checkpoint_io = io

    @override
    def teardown(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
        super().teardown()
