"""``HeteroStrategy``: Lightning's DDP with capacity-sized per-rank batches and weighted reduction.

Lifecycle (each step is a small override of ``DDPStrategy`` that calls ``super()``)::

    setup_environment     -> the runtime (a later run of the Trainer's model goes on from the earlier
                             one's), and this rank's dtype under precision_policy
    setup                 -> hetero places the samplers; mode="hybrid": HybridCallback (lightning.hybrid)
    _register_ddp_hooks   -> register our comm hook on every device (Lightning does it on CUDA only)
    process_dataloader    -> train: probe/split, HeteroBatchSampler; val/test: DistributedSampler
    on_train_batch_start  -> set this rank's reduction weight b_r / G_t for the step
    training_step/backward-> a timed-out collective becomes a StallError naming peer, phase, step
    optimizer_step        -> the non-finite rule, per-rank timings, metrics; in mode="hybrid" the
                             local step (no_sync), the period's sync, join at the epoch's end
    reduce                -> mode="hybrid": no sync_dist=True log inside a local phase's batch
    save/load_checkpoint  -> every rank's sampler and hook state: gathered into Lightning's file, or
                             each rank's own shard, asynchronously (state_dict_type="sharded")

Its parts are held, not inherited: the runtime (per run), LoaderPlacement, CheckpointFormats, HybridLoop;
the events it shares with ``HeteroFSDPStrategy`` (data, batch start, step end) are RuntimeParts'.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel
from typing_extensions import override

from hetero_strategy.config import HeteroConfig
from hetero_strategy.lightning.checkpoints import CheckpointFormats, readable_checkpoint
from hetero_strategy.lightning.environment import allow_uneven_nodes, job_world_size
from hetero_strategy.lightning.hybrid import HybridLoop
from hetero_strategy.lightning.metrics import log_runtime_metrics
from hetero_strategy.lightning.options import dropping_nonfinite, max_steps_of, strategy_config
from hetero_strategy.lightning.precision import check_trainer_precision, policy_plugin
from hetero_strategy.lightning.quiet import show_epoch_total
from hetero_strategy.lightning.runtime_parts import RuntimeParts
from hetero_strategy.runtime.sharded_io import is_sharded

__all__ = ["HeteroStrategy"]


class HeteroStrategy(RuntimeParts, DDPStrategy):
    """DDP for heterogeneous clusters.

    The DataLoader's ``batch_size`` B is the *mean* per-rank batch: the global batch G = B x world
    size is what plain DDP would use, split across ranks by capacity. The reduced gradient is
    sum_r b_r g_r / G, so training follows one process with batch G.

    The keywords from ``accelerator`` to ``start_method`` are Lightning's ``DDPStrategy`` arguments.

    Example::

        import lightning as L
        import hetero_strategy  # registers strategy="hetero"

        trainer = L.Trainer(strategy="hetero", accelerator="cpu", devices=2)
        trainer = L.Trainer(strategy=hetero_strategy.HeteroStrategy(batch_sizes=[3, 13]), devices=2)

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
        compression: the comm hook: none, topk, topk_allreduce, tiered, onebit, fp16, bf16, powersgd or auto.
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
        # Lightning's DDPStrategy arguments
        accelerator: Any = None, parallel_devices: list[torch.device] | None = None, cluster_environment: Any = None,
        checkpoint_io: Any = None, precision_plugin: Any = None, process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30), start_method: str = "popen",
        **kwargs: Any,
    ) -> None:
        self.hetero_config = strategy_config(config, dict(locals()), kwargs)  # pops config fields from kwargs
        self.state_dict_type = state_dict_type
        precision_plugin = policy_plugin(self.hetero_config.precision.precision_policy, precision_plugin,
                                         lambda: self.runtime)
        # Gradients as views into DDP's buckets: no copy of the whole gradient into the buckets
        # and back each step (measurable on a slow device). Pass False to get DDP's default back.
        kwargs.setdefault("gradient_as_bucket_view", True)
        super().__init__(accelerator=accelerator, parallel_devices=parallel_devices,
                         cluster_environment=cluster_environment, checkpoint_io=checkpoint_io,
                         precision_plugin=precision_plugin, process_group_backend=process_group_backend,
                         timeout=timeout, start_method=start_method, **kwargs)
        self._init_parts()  # the runtime (per run) and the loader placement (runtime_parts.py)
        self._checkpoints = CheckpointFormats()  # "full" and "sharded", with the writer between saves
        self._hybrid = HybridLoop(hybrid_monitor)  # mode="hybrid": local-SGD phases in Lightning's loop

    # ---- registry ------------------------------------------------------------------------
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

    @property
    def hybrid_monitor(self) -> str:
        return self._hybrid.monitor

    # ---- setup ---------------------------------------------------------------------------
    @override
    def setup(self, trainer: Any) -> None:
        self._loaders.setup(trainer)  # hetero places the samplers (process_dataloader)
        show_epoch_total(trainer)  # not "Epoch 0/-2" under max_steps (quiet.py)
        check_trainer_precision(trainer, self.hetero_config.precision.precision_policy)
        if self.runtime.precision is not None:
            self.runtime.precision.keep_fp32(trainer.lightning_module)
        self._hybrid.setup(trainer, self.runtime)
        super().setup(trainer)
        self._guard_zero_grad()  # micro-batching (runtime_parts.py)
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
        self._start_runtime().setup_precision(self.root_device)

    @override
    def _register_ddp_hooks(self) -> None:
        # NOTE: DDPStrategy registers comm hooks only on CUDA; on CPU/gloo that would silently fall
        # back to DDP's divide-by-world-size, which is wrong for unequal batches.
        assert isinstance(self.model, DistributedDataParallel)
        self.runtime.register_hook(self.model, max_steps=max_steps_of(self._trainer()))

    # ---- per step (batch start, forward and step end: runtime_parts.py) --------------------
    @override
    def backward(self, closure_loss: torch.Tensor, optimizer: Any, *args: Any, **kwargs: Any) -> torch.Tensor:
        with self.runtime.phase("exchange"):  # the comm hook's exchange runs inside backward
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        if self.runtime.precision is None and getattr(self.precision_plugin, "scaler", None) is None:
            closure = dropping_nonfinite(closure, optimizer, self.runtime)  # a GradScaler decides itself
        out = super().optimizer_step(optimizer, self._hybrid.closure(closure, self.model, self.runtime), model,
                                     **kwargs)
        trainer = self._step_end()
        if self._hybrid.join_if_done(trainer, self.runtime):  # this rank's training stops here
            log_runtime_metrics(self.lightning_module, trainer, self.runtime)
        return out

    @override
    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        self._hybrid.check_reduce(self._trainer(), self.runtime)
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    # ---- checkpoints (see hetero_strategy.lightning.checkpoints) ---------------------------
    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        self.runtime.require_synced("a checkpoint save")
        if self.state_dict_type == "sharded":
            self._checkpoints.save_sharded(checkpoint, filepath, storage_options, self.runtime)
            return
        self._checkpoints.gather_into(checkpoint, self.runtime)  # Lightning writes rank 0's file only
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def remove_checkpoint(self, filepath: Any) -> None:
        if not self._checkpoints.remove_after_commit(filepath):
            super().remove_checkpoint(filepath)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        self._checkpoints.settle()
        if is_sharded(checkpoint_path):
            model_state = self.lightning_module.state_dict()  # read in place: no second copy of the model
            return self._checkpoints.load_sharded(checkpoint_path, model_state, self.runtime)
        with readable_checkpoint(checkpoint_path):
            checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        return self._checkpoints.restore(checkpoint, self.runtime)

    @override
    def teardown(self) -> None:
        self._checkpoints.close()
        if self._runtime is not None:
            self._runtime.close()
        super().teardown()
