"""Which autocast dtype a rank uses (DESIGN.md semantics 9).

``auto``: bf16 on compute capability >= 8.0 (A100, 3090, H100), fp16 with loss scaling on 7.x
(V100, T4), fp32 below that and on CPU. A policy may also name one dtype for every rank, list
one per rank, or map device-name parts / capabilities to dtypes.

Example::

    resolve_dtype("auto", rank=0, world=2, device=DeviceInfo("cuda", "Tesla V100", (7, 0)))  # 'fp16'
    resolve_dtype({"V100": "fp32", "default": "bf16"}, 0, 2, DeviceInfo("cuda", "A100", (8, 0)))  # 'bf16'
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetero_strategy.config import ConfigError

__all__ = ["DeviceInfo", "auto_dtype", "describe_device", "resolve_dtype"]

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


@dataclass(frozen=True)
class DeviceInfo:
    """What the policy looks at: device type, its name, and (CUDA) its compute capability."""

    type: str
    name: str
    capability: tuple[int, int] | None = None


def describe_device(device: torch.device) -> DeviceInfo:
    """The :class:`DeviceInfo` of a real device (CUDA reads its name and capability)."""
    if device.type == "cuda":
        index = device.index if device.index is not None else torch.cuda.current_device()
        return DeviceInfo("cuda", torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
    return DeviceInfo(device.type, device.type)


def auto_dtype(info: DeviceInfo) -> str:
    """bf16 from compute capability 8.0, fp16 on 7.x, fp32 otherwise (and on CPU)."""
    if info.type != "cuda" or info.capability is None:
        return "fp32"
    major = info.capability[0]
    return "bf16" if major >= 8 else "fp16" if major == 7 else "fp32"


def resolve_dtype(policy, rank: int, world: int, info: DeviceInfo) -> str:
    """This rank's dtype name under ``policy`` (validated by PrecisionConfig; None means fp32)."""
    if policy is None:
        return "fp32"
    if isinstance(policy, str):
        return auto_dtype(info) if policy == "auto" else policy
    if isinstance(policy, (list, tuple)):
        if len(policy) != world:
            raise ConfigError(f"precision_policy={list(policy)!r} is invalid: {len(policy)} entries for {world} "
                              "ranks; give one dtype per rank")
        return policy[rank]
    if info.capability is not None:
        cap = f"{info.capability[0]}.{info.capability[1]}"
        if cap in policy:
            return _named(policy[cap], info)
    for key, value in policy.items():
        if key != "default" and key.lower() in info.name.lower():
            return _named(value, info)
    return _named(policy.get("default", "auto"), info)


def _named(value: str, info: DeviceInfo) -> str:
    return auto_dtype(info) if value == "auto" else value
