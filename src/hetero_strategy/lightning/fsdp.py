"""``HeteroFSDPStrategy``: Lightning's FSDP2 path (``ModelParallelStrategy``, data parallel only)
with capacity-sized per-rank batches and an exact, sample-weighted reduce-scatter.

Lifecycle (each a small override that forwards to the runtime, as ``HeteroStrategy`` does)::

    setup_environment    -> a 1-D data-parallel mesh over every rank; the runtime
    setup                -> a model the user did not shard in configure_model is sharded here
                            (every module named in auto_wrap_policy, then each top-level child);
                            runtime.register_sharded: the reduce-scatter sums
    process_dataloader   -> train: probe/split, HeteroBatchSampler; val/test: DistributedSampler
    on_train_batch_start -> this rank's weight b_r / G_t
    backward             -> loss x b_r / G_t, so the summed shards are one process's gradient
    optimizer_step       -> per-rank timings, calibration, metrics
    save/load_checkpoint -> Lightning's torch.distributed.checkpoint directory, every rank's
                            hetero state gathered into its metadata file

The algorithms are the runtime's (hetero_strategy.runtime.fsdp); nothing is decided here.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import Any

from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.lightning.checkpoints import CheckpointFormats
from hetero_strategy.lightning.environment import job_world_size
from hetero_strategy.lightning.options import flat_config
from hetero_strategy.lightning.quiet import show_epoch_total
from hetero_strategy.lightning.runtime_parts import RuntimeParts
from hetero_strategy.runtime.fsdp import (
    check_sharded_config,
    fsdp_modules,
    policy_mp,
    shard_model,
    wrap_class_names,
)

__all__ = ["HeteroFSDPStrategy"]


class HeteroFSDPStrategy(RuntimeParts, ModelParallelStrategy):
    """FSDP2 for heterogeneous clusters: each rank holds a shard of the model and its own batch size.

    The DataLoader's ``batch_size`` B is the mean per-rank batch; the global batch G = B x world
    size is split by capacity, and every step equals one process's SGD on G (docs/fsdp.md).

    Example::

        trainer = L.Trainer(strategy="hetero_fsdp", accelerator="cpu", devices=2)
        trainer = L.Trainer(strategy=HeteroFSDPStrategy(batch_sizes=[3, 5],
                                                        auto_wrap_policy=["TransformerEncoderLayer"]))

    Args:
        config: a :class:`HeteroConfig`, or the path of a YAML file holding one.
        batch_sizes: explicit per-rank batch sizes (sum = B x world size).
        capacities: relative per-rank capacities; batch sizes are split in proportion.
        alpha: weight of measured compute in a rank's capacity (see :class:`HeteroConfig`).
        beta: weight of measured bandwidth in a rank's capacity.
        max_batch_sizes: per-rank caps on one pass; a larger share runs as several (docs/fsdp.md).
        probe_steps: timed steps per batch size in the start-up probe.
        seed: the sampler's shuffle seed (default: 0).
        calibrate: keep moving the batch shares toward equal finishing times while training.
        precision_policy: None, or one dtype for every rank ("bf16" or "fp32"): FSDP2 needs one
            parameter dtype on all ranks. Per-rank dtypes need ``strategy="hetero"``.
        auto_wrap_policy: module classes (or their names) that get an FSDP unit of their own when
            the strategy shards the model, like Accelerate's ``transformer_layer_cls_to_wrap``.
        mp_policy: a ``torch.distributed.fsdp.MixedPrecisionPolicy`` for every rank (default:
            from ``precision_policy``, gradients reduced in fp32).
        reshard_after_forward: ``fully_shard``'s: free gathered parameters after each forward.
        save_distributed_checkpoint: ``ModelParallelStrategy``'s: one shard file per rank (default).
        process_group_backend: ``ModelParallelStrategy``'s.
        timeout: ``ModelParallelStrategy``'s process-group timeout.
        **kwargs: any other field of :class:`HeteroConfig`.
    """

    strategy_name = "hetero_fsdp"

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
        precision_policy: str | None = None,
        auto_wrap_policy: Any = None,
        mp_policy: Any = None,
        reshard_after_forward: bool = True,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = timedelta(minutes=30),
        **kwargs: Any,
    ) -> None:
        self.hetero_config = flat_config(config, dict(locals()), kwargs)  # pops config fields from kwargs
        if kwargs:
            key = next(iter(kwargs))
            raise ConfigError(f"{key}={kwargs[key]!r} is invalid: unknown option; HeteroFSDPStrategy takes the "
                              "fields of HeteroConfig, auto_wrap_policy, mp_policy, reshard_after_forward and "
                              "ModelParallelStrategy's save_distributed_checkpoint, process_group_backend, timeout")
        check_sharded_config(self.hetero_config)
        self.auto_wrap_policy = wrap_class_names(auto_wrap_policy)  # refused now if malformed
        self.mp_policy = policy_mp(self.hetero_config, mp_policy)
        self.reshard_after_forward = reshard_after_forward
        super().__init__(save_distributed_checkpoint=save_distributed_checkpoint,
                         process_group_backend=process_group_backend, timeout=timeout)
        self._init_parts()  # the runtime (per run) and the loader placement (runtime_parts.py)
        self._checkpoints = CheckpointFormats()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: Any) -> None:
        strategy_registry.register("hetero_fsdp", cls, description="Heterogeneous-cluster FSDP2 "
                                   "(capacity-sized batches, sharded model)")

    # ---- setup ---------------------------------------------------------------------------
    @override
    def setup_environment(self) -> None:
        world = job_world_size(self.cluster_environment, self.num_nodes, self.num_processes)
        self.hetero_config.balance.check_world_size(world)  # before any collective could hang on it
        self._data_parallel_size, self._tensor_parallel_size = world, 1  # data parallel only
        super().setup_environment()
        self._start_runtime()

    @override
    def setup(self, trainer: Any) -> None:
        # NOTE: ModelParallelStrategy.setup refuses a module without configure_model; here the
        # strategy shards such a model itself, then does the same steps in the same order.
        from lightning.fabric.utilities.init import _materialize_distributed_module
        from lightning.fabric.utilities.optimizer import _optimizers_to_device

        self._loaders.setup(trainer)
        show_epoch_total(trainer)  # not "Epoch 0/-2" under max_steps (quiet.py)
        self.accelerator.setup(trainer)
        self._shard(self.model)
        _materialize_distributed_module(self.model, self.root_device)
        self.model = self.precision_plugin.convert_module(self.model)
        self.model_to_device()
        self.barrier()
        if trainer.state.fn == TrainerFn.FITTING:
            self.setup_optimizers(trainer)
            self._guard_zero_grad()  # micro-batching (runtime_parts.py)
        self.setup_precision_plugin()
        if trainer.state.fn == TrainerFn.FITTING:
            _optimizers_to_device(self.optimizers, self.root_device)

    def _shard(self, module: Any) -> None:
        """Shard what configure_model left unsharded; make the reduce-scatter a sum weighted per rank."""
        if not fsdp_modules(module):
            direct = [name for name, _ in module.named_parameters(recurse=False)]
            if direct:
                raise ConfigError(f"parameters {direct} sit directly on the LightningModule: the strategy shards "
                                  "its submodules, which Lightning's training_step calls; move them into a "
                                  "submodule, or call fully_shard yourself in configure_model")
            mesh = self.device_mesh["data_parallel"]
            for child in module.children():
                if any(True for _ in child.parameters()):
                    shard_model(child, mesh, self.auto_wrap_policy, self.mp_policy, self.reshard_after_forward)
        self.runtime.register_sharded(fsdp_modules(module))

    # ---- per step (batch start, forward and step end: runtime_parts.py) --------------------
    @override
    def backward(self, closure_loss: Any, optimizer: Any, *args: Any, **kwargs: Any) -> Any:
        with self.runtime.phase("exchange"):  # the reduce-scatter runs inside backward
            return super().backward(self.runtime.scale_loss(closure_loss), optimizer, *args, **kwargs)

    @override
    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        out = super().optimizer_step(optimizer, closure, model, **kwargs)
        self._step_end()
        return out

    # ---- checkpoints: Lightning's DCP directory; every rank's hetero state in its metadata -------
    @override
    def save_checkpoint(self, checkpoint: dict[str, Any], filepath: Any, storage_options: Any = None) -> None:
        self._checkpoints.gather_into(checkpoint, self.runtime)  # rank 0 writes the metadata file
        super().save_checkpoint(checkpoint, filepath, storage_options)

    @override
    def load_checkpoint(self, checkpoint_path: Any, weights_only: bool | None = None) -> dict[str, Any]:
        checkpoint = super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        return self._checkpoints.restore(checkpoint, self.runtime)

    @override
    def teardown(self) -> None:
        if self._runtime is not None:
            self._runtime.close()
        super().teardown()
