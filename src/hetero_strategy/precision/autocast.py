"""This rank's precision in action: autocast in its dtype, an fp32 keep-list, its loss scaler.

Parameters and optimizer state stay fp32 on every rank (DDP's buckets must match across ranks);
only the forward's compute dtype differs. Modules on the keep-list (LayerNorm, Softmax by
default: their reductions lose too much in half precision) run in fp32 with autocast off.

Example::

    rp = RankPrecision.build(config.precision, rank, world, device)    # prints its choice
    rp.keep_fp32(model)
    with rp.autocast():
        loss = loss_fn(model(x), y)
    rp.scaler.scale_loss(loss).backward()
"""

from __future__ import annotations

import contextlib
import logging
from dataclasses import dataclass

import torch
from torch import nn

from hetero_strategy.cluster.devices import DeviceInfo
from hetero_strategy.config import ConfigError
from hetero_strategy.dist import all_gather_floats
from hetero_strategy.precision.policy import TORCH_DTYPES, choose_dtype
from hetero_strategy.precision.scaler import CoordinatedScaler

__all__ = ["RankPrecision"]

log = logging.getLogger(__name__)


@dataclass
class RankPrecision:
    """One rank's dtype, device type and loss scaler."""

    dtype: str
    device_type: str
    scaler: CoordinatedScaler
    keep: tuple[str, ...] = ("LayerNorm", "Softmax")

    @classmethod
    def build(cls, config, rank: int, world: int, device: torch.device, info=None) -> RankPrecision:
        """From a PrecisionConfig; ``info`` (a DeviceInfo) overrides what the device reports."""
        info = info or DeviceInfo.of(device)
        try:
            dtype, why = choose_dtype(config.precision_policy, rank, world, info)
            error = None
        except ConfigError as e:  # e.g. two name parts of this rank's device only
            error = e
        # NOTE: collective, so every rank stops when one rank's device cannot be resolved, instead
        # of the others waiting for it at their next collective
        failed = [r for r, (flag,) in enumerate(all_gather_floats([float(error is not None)])) if flag]
        if failed:
            raise error or ConfigError(f"precision_policy={config.precision_policy!r} is invalid on rank(s) "
                                       f"{failed}: see the error there for the fix")
        scaler = CoordinatedScaler(dtype == "fp16", config.init_scale, config.growth_factor,
                                   config.backoff_factor, config.growth_interval)
        rp = cls(dtype, device.type, scaler, tuple(config.keep_fp32))
        cap = "" if info.capability is None else " (compute capability {}.{})".format(*info.capability)
        message = (f"hetero_strategy: rank {rank} autocasts in {dtype}"
                   f"{' with loss scaling' if dtype == 'fp16' else ''} on {info.name}{cap}; {why}")
        print(message, flush=True)  # NOTE: every rank says it: the choice differs per rank
        log.info(message)
        return rp

    @property
    def torch_dtype(self) -> torch.dtype:
        return TORCH_DTYPES[self.dtype]

    def autocast(self) -> contextlib.AbstractContextManager:
        """Autocast in this rank's dtype; fp32 runs without autocast."""
        if self.dtype == "fp32":
            return contextlib.nullcontext()
        return torch.autocast(self.device_type, dtype=self.torch_dtype)

    def keep_fp32(self, module: nn.Module) -> int:
        """Make the keep-list's submodules run in fp32 (autocast off, inputs cast up); returns how many.

        Forward hooks, not a patched ``forward``: a deep copy (EMA, SWA) keeps its own weights and
        the model still pickles.
        """
        if self.dtype == "fp32":
            return 0
        count = 0
        for sub in module.modules():
            if type(sub).__name__ in self.keep and not getattr(sub, "_hetero_fp32", False):
                region = _Fp32Region(self.device_type)
                sub.register_forward_pre_hook(region.enter, with_kwargs=True)
                sub.register_forward_hook(region.exit, always_call=True)
                sub._hetero_fp32 = True
                count += 1
        return count


def _up(x):
    return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x


class _Fp32Region:
    """Autocast off and floating inputs in fp32 between a module's pre- and post-forward hooks."""

    def __init__(self, device_type: str) -> None:
        self.device_type = device_type
        self._open: list = []  # NOTE: a stack: a module may run inside itself (recursion, re-entry)

    def enter(self, _module, args, kwargs):
        ctx = torch.autocast(self.device_type, enabled=False)
        ctx.__enter__()
        self._open.append(ctx)
        return tuple(_up(a) for a in args), {k: _up(v) for k, v in kwargs.items()}

    def exit(self, _module, _args, _output):
        self._open.pop().__exit__(None, None, None)  # always_call: also when forward raised

    def __getstate__(self):
        return {"device_type": self.device_type, "_open": []}
