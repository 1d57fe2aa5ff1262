"""Settings of an ``Accelerator`` that HeteroPlugin cannot honour, refused before anything runs."""

from __future__ import annotations

from typing import Any

from hetero_strategy.config import ConfigError

__all__ = ["check_accelerator", "second_hook_error"]

_SUPPORTED = ("NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "MULTI_MLU", "MULTI_MUSA", "MULTI_HPU")


def check_accelerator(accelerator: Any) -> None:
    """Refuse distributed types, data-loader modes and comm hooks that would break hetero's semantics."""
    kind = accelerator.distributed_type.name if hasattr(accelerator.distributed_type, "name") \
        else str(accelerator.distributed_type)
    if kind == "FSDP" and getattr(accelerator, "is_fsdp2", False):
        pass  # FSDP2: a summed reduce-scatter, the loss weighted per rank (runtime/fsdp.py)
    elif kind == "FSDP":
        raise ConfigError("FullyShardedDataParallelPlugin(fsdp_version=1) is invalid with HeteroPlugin: it weights "
                          "ranks through FSDP2's reduce-scatter; use fsdp_version=2 (fsdp_version: 2 in the "
                          "accelerate config), or DDP")
    elif kind not in _SUPPORTED:
        raise ConfigError(
            f"Accelerator.distributed_type={kind} is invalid with HeteroPlugin: it sizes per-rank batches and "
            "reduces gradients in a DDP comm hook or FSDP2's reduce-scatter, and DeepSpeed/Megatron/XLA reduce "
            "gradients themselves. Use plain Accelerate for those, or launch with DDP (multi_gpu / MULTI_CPU) or "
            "FSDP2 for hetero"
        )
    if accelerator.split_batches:
        raise ConfigError(
            "Accelerator(split_batches=True) is invalid with HeteroPlugin: it cuts every batch into equal "
            "slices, while hetero gives each rank a capacity-sized slice. Use split_batches=False and give "
            "the DataLoader the mean per-rank batch B (global batch G = B x num_processes)"
        )
    if accelerator.dispatch_batches:
        raise ConfigError(
            "Accelerator(dispatch_batches=True) is invalid with HeteroPlugin: the main process would load "
            "and hand out equal batches. Use dispatch_batches=False (DataLoaderConfiguration) with a "
            "map-style dataset; every rank then loads its own slice"
        )
    if getattr(accelerator, "use_stateful_dataloader", False):
        raise ConfigError(
            "DataLoaderConfiguration(use_stateful_dataloader=True) is invalid with HeteroPlugin: a stateful "
            "loader fast-forwards the sampler on resume without the per-batch plans hetero weights gradients "
            "by. Use use_stateful_dataloader=False and resume at an epoch boundary (loader.set_epoch)"
        )
    handler = getattr(accelerator, "ddp_handler", None)
    for name in ("comm_hook", "comm_wrapper"):
        value = getattr(handler, name, None)
        if value is not None and str(getattr(value, "value", value)).lower() != "no":
            raise ConfigError(
                f"DistributedDataParallelKwargs({name}={value}) is invalid with HeteroPlugin: a DDP model takes "
                "one comm hook, and HeteroPlugin registers its own (sample-weighted, with the chosen codec). "
                "Drop the Accelerate comm hook and pick a codec with HeteroPlugin(compression=...)"
            )


def second_hook_error(error: RuntimeError) -> ConfigError | None:
    """DDP's refusal of a second comm hook, told in our words (None for any other error)."""
    if "only be called once" not in str(error):
        return None
    return ConfigError(
        "model already has a DDP comm hook (register_comm_hook was called on it); HeteroPlugin registers its "
        "own. Remove the other register_comm_hook call and pick a codec with HeteroPlugin(compression=...)"
    )


def check_precision(accelerator: Any, policy: Any) -> None:
    """With a precision policy hetero picks each rank's dtype; Accelerate's own must be off."""
    mixed = str(getattr(accelerator, "mixed_precision", "no"))
    if policy is not None and mixed != "no":
        raise ConfigError(f"mixed_precision={mixed!r} conflicts with precision_policy={policy!r}: the policy picks "
                          "each rank's dtype; use Accelerator(mixed_precision='no') (or drop precision_policy to "
                          "let Accelerate decide)")
