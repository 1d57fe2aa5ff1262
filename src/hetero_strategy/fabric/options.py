"""HeteroFabricStrategy's keywords: its HeteroConfig, and what it refuses at construction."""

from __future__ import annotations

from typing import Any

from lightning.fabric.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.config.errors import refuse_unknown_keywords

__all__ = ["fabric_config"]


def fabric_config(config: Any, named: dict[str, Any], kwargs: dict[str, Any]) -> HeteroConfig:
    """The strategy's HeteroConfig (``config`` with the keywords on top, those of ``kwargs`` popped);
    every keyword checked here, before Fabric builds anything."""
    resolved = HeteroConfig.from_keywords(config, named, kwargs)
    _check_ddp_kwargs(kwargs)
    if resolved.hybrid.mode != "sync":
        raise ConfigError(f"mode={resolved.hybrid.mode!r} is invalid with HeteroFabricStrategy: local-SGD phases "
                          "are wired into Lightning's Trainer (HeteroStrategy) and Accelerate (HeteroPlugin) only; "
                          "use mode='sync' with Fabric")
    if resolved.reliability.checkpoint_dir is not None:
        raise ConfigError(f"checkpoint_dir={resolved.reliability.checkpoint_dir!r} is invalid with "
                          "HeteroFabricStrategy: Fabric saves where your loop says; call fabric.save(path, state) "
                          "and fabric.load(path, state): every rank's hetero state rides in that file")
    if resolved.balance.max_batch_sizes is not None:
        raise ConfigError(f"max_batch_sizes={resolved.balance.max_batch_sizes} is invalid with HeteroFabricStrategy: "
                          "a share above its cap would need passes your loop does not run; give batch_sizes= within "
                          "the caps (or capacities=), or use HeteroStrategy / HeteroPlugin.micro_batches")
    loss_fn, max_steps = named.get("loss_fn"), named.get("max_steps")
    if loss_fn is not None and not callable(loss_fn):
        raise ConfigError(f"loss_fn={loss_fn!r} is invalid: pass a function loss_fn(model, batch) -> scalar "
                          "loss that the start-up probe times, or None for the default")
    if max_steps is not None and (isinstance(max_steps, bool) or not isinstance(max_steps, int) or max_steps < 1):
        raise ConfigError(f"max_steps={max_steps!r} is invalid: the run's length in optimizer steps (the "
                          "compression density schedule's period) must be an integer >= 1, or None")
    return resolved


def _check_ddp_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse keywords neither hetero nor Fabric's DDP knows, here rather than deep inside DDP's constructor."""
    refuse_unknown_keywords(kwargs, (DistributedDataParallel.__init__, DDPStrategy.__init__),
                            "HeteroFabricStrategy takes the fields of HeteroConfig, loss_fn, max_steps, and Fabric "
                            "DDPStrategy/DistributedDataParallel keywords")
