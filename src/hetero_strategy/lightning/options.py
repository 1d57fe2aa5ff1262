"""HeteroStrategy's keywords (its HeteroConfig, and what it refuses at construction), and the
helpers of its steps that read Lightning objects: the run's length, the non-finite rule."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from lightning.pytorch.strategies import DDPStrategy
from torch.nn.parallel import DistributedDataParallel

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.config.errors import refuse_unknown_keywords
from hetero_strategy.lightning.checkpoints import check_state_dict_type
from hetero_strategy.lightning.hybrid import check_hybrid_monitor

__all__ = ["check_checkpoint_dir", "check_ddp_kwargs", "dropping_nonfinite", "flat_config", "max_steps_of",
           "refuse_comm_hooks", "strategy_config"]


def max_steps_of(trainer: Any) -> int | Any | None:
    """trainer.max_steps when set; else Lightning's estimate, read lazily (it needs the data)."""
    steps = getattr(trainer, "max_steps", None)
    if isinstance(steps, int) and steps > 0:
        return steps
    if trainer is not None and hasattr(trainer, "estimated_stepping_batches"):
        return lambda: trainer.estimated_stepping_batches
    return None


def strategy_config(config: Any, named: dict[str, Any], kwargs: dict[str, Any]) -> HeteroConfig:
    """HeteroStrategy's HeteroConfig: ``config`` with the fields given as keywords on top (those of
    ``named``, the constructor's own, that are set, and those of ``kwargs``, popped from it); every
    keyword checked here, before anything is built."""
    resolved = flat_config(config, named, kwargs)
    check_ddp_kwargs(kwargs)
    check_checkpoint_dir(resolved)
    check_state_dict_type(named["state_dict_type"])
    check_hybrid_monitor(named["hybrid_monitor"])
    refuse_comm_hooks(kwargs)
    return resolved


def flat_config(config: Any, named: dict[str, Any], kwargs: dict[str, Any]) -> HeteroConfig:
    """``config`` with the HeteroConfig fields among ``named`` (set ones) and ``kwargs`` (popped) on top."""
    return HeteroConfig.from_keywords(config, named, kwargs)


def check_ddp_kwargs(kwargs: dict[str, Any]) -> None:
    """Refuse keywords neither hetero nor DDP knows, here rather than deep inside DDP's constructor."""
    refuse_unknown_keywords(kwargs, (DistributedDataParallel.__init__, DDPStrategy.__init__),
                            "HeteroStrategy takes the fields of HeteroConfig plus DDPStrategy/DistributedDataParallel "
                            "keywords")


def refuse_comm_hooks(kwargs: dict[str, Any]) -> None:
    """DDPStrategy's comm-hook keywords: HeteroStrategy registers its own hook."""
    for name in ("ddp_comm_hook", "ddp_comm_state", "ddp_comm_wrapper"):
        if kwargs.get(name) is not None:
            raise ConfigError(f"{name}={kwargs[name]!r} is invalid with HeteroStrategy: it registers its own "
                              "comm hook; choose a codec with compression=... instead")


def check_checkpoint_dir(config: Any) -> None:
    """Lightning schedules its own checkpoints (ModelCheckpoint); HeteroStrategy only writes them."""
    directory = config.reliability.checkpoint_dir
    if directory is not None:
        raise ConfigError(f"checkpoint_dir={directory!r} is invalid with HeteroStrategy: Lightning saves "
                          "checkpoints itself. Use ModelCheckpoint(every_n_train_steps=... or train_time_interval="
                          "...) and Trainer.fit(ckpt_path='last'), with HeteroStrategy(state_dict_type='sharded') for "
                          "asynchronous per-rank shards: every rank's hetero state (residuals, shares, data "
                          "position) rides in them; checkpoint_dir is for HeteroPlugin and bare DDP")


def dropping_nonfinite(closure: Callable[[], Any], optimizer: Any, runtime: Any) -> Callable[[], Any]:
    """Lightning's closure (forward, backward, exchange), then the non-finite rule on the reduced
    gradient: a dropped step's gradients are cleared, so the optimizer's step changes nothing."""

    def run() -> Any:
        out = closure()
        runtime.drop_nonfinite(p for group in optimizer.param_groups for p in group["params"])
        return out

    return run
