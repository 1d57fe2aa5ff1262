"""Which autocast dtype a rank uses (DESIGN.md semantics 9).

``auto``: bf16 on compute capability >= 8.0 (A100, 3090, H100), fp16 with loss scaling on 7.x
(V100, T4), fp32 below that and on CPU. A policy may also name one dtype for every rank, list
one per rank, or map device-name parts / capabilities to dtypes.

Example::

    resolve_dtype("auto", rank=0, world=2, device=DeviceInfo("cuda", "Tesla V100", (7, 0)))  # 'fp16'
    resolve_dtype({"V100": "fp32", "default": "bf16"}, 0, 2, DeviceInfo("cuda", "A100", (8, 0)))  # 'bf16'
    choose_dtype({"A100": "fp32", "8.0": "bf16"}, 0, 2, DeviceInfo("cuda", "NVIDIA A100-SXM4", (8, 0)))
    # ('fp32', "precision_policy key 'A100'"): a name part is more specific than a capability
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from hetero_strategy.config import ConfigError
from hetero_strategy.config.precision import CAPABILITY_KEY, name_words

__all__ = ["DeviceInfo", "auto_dtype", "choose_dtype", "describe_device", "resolve_dtype"]

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
    return choose_dtype(policy, rank, world, info)[0]


def choose_dtype(policy, rank: int, world: int, info: DeviceInfo) -> tuple[str, str]:
    """This rank's dtype name and why (for the start-up line): which rule or mapping key decided.

    A mapping is read most specific first: a device-name part (whole words of the device's name,
    so "A10" is not an A100 and "L4" not an L40S; the longest matching part wins), then the
    compute capability ("7.0"), then "default", else auto.
    """
    if policy is None:
        return "fp32", "no policy"
    if isinstance(policy, str):
        return (auto_dtype(info), "auto") if policy == "auto" else (policy, f"auto would pick {auto_dtype(info)}")
    if isinstance(policy, (list, tuple)):
        if len(policy) != world:
            raise ConfigError(f"precision_policy={list(policy)!r} is invalid: {len(policy)} entries for {world} "
                              "ranks; give one dtype per rank")
        return policy[rank], f"entry {rank} of the list; auto would pick {auto_dtype(info)}"
    name = name_words(info.name)
    parts = [k for k in policy if k != "default" and not CAPABILITY_KEY.match(k) and _contains(name, name_words(k))]
    longest = max((len(name_words(k)) for k in parts), default=0)
    best = [k for k in parts if len(name_words(k)) == longest]
    if len(best) > 1:
        raise ConfigError(f"precision_policy keys {best!r} are ambiguous: each names a part of device "
                          f"{info.name!r}; keep one, or write more of the name (e.g. {info.name!r})")
    cap = None if info.capability is None else f"{info.capability[0]}.{info.capability[1]}"
    key = best[0] if best else cap if cap in policy else "default" if "default" in policy else None
    if key is None:
        return auto_dtype(info), "no precision_policy key matched: auto"
    value = policy[key]
    return (auto_dtype(info) if value == "auto" else value), f"precision_policy key {key!r}"


def _contains(name: tuple[str, ...], part: tuple[str, ...]) -> bool:
    """Whether the words ``part`` occur in a row inside ``name``."""
    n = len(part)
    return n > 0 and any(name[i:i + n] == part for i in range(len(name) - n + 1))
