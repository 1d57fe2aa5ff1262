"""Which autocast dtype a rank uses (docs/design.md semantics 9).

``auto``: the one capability rule, :func:`~hetero_strategy.cluster.devices.training_dtype`.
A policy may also name one dtype for every rank, list
one per rank, or map device-name parts / capabilities to dtypes.

Example::

    resolve_dtype("auto", rank=0, world=2, device=DeviceInfo("cuda", "Tesla V100", (7, 0)))  # 'fp16'
    resolve_dtype({"V100": "fp32", "default": "bf16"}, 0, 2, DeviceInfo("cuda", "A100", (8, 0)))  # 'bf16'
    choose_dtype({"A100": "fp32", "8.0": "bf16"}, 0, 2, DeviceInfo("cuda", "NVIDIA A100-SXM4", (8, 0)))
    # ('fp32', "precision_policy key 'A100'"): a name part is more specific than a capability
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from hetero_strategy.cluster.devices import DeviceInfo, training_dtype
from hetero_strategy.config import ConfigError, counted
from hetero_strategy.config.precision import CAPABILITY_KEY, name_words

__all__ = ["choose_dtype", "policy_plugin", "resolve_dtype"]

TORCH_DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}


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
        return (training_dtype(info), "auto") if policy == "auto" else (policy, f"auto would pick {training_dtype(info)}")
    if isinstance(policy, (list, tuple)):
        if len(policy) != world:
            raise ConfigError(f"precision_policy={list(policy)!r} is invalid: "
                              f"{counted(len(policy), 'entry', 'entries')} for {counted(world, 'rank')}; "
                              "give one dtype per rank")
        return policy[rank], f"entry {rank} of the list; auto would pick {training_dtype(info)}"
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
        return training_dtype(info), "no precision_policy key matched: auto"
    value = policy[key]
    return (training_dtype(info) if value == "auto" else value), f"precision_policy key {key!r}"


def _contains(name: tuple[str, ...], part: tuple[str, ...]) -> bool:
    """Whether the words ``part`` occur in a row inside ``name``."""
    n = len(part)
    return n > 0 and any(name[i:i + n] == part for i in range(len(name) - n + 1))


def policy_plugin(policy: Any, given: Any, field: str, make: Callable[[], Any]) -> Any:
    """A framework's precision plugin under ``precision_policy``: ``make()`` (the adapter's per-rank
    autocast plugin), refusing the user's own (``given``, passed as ``field``) beside it; without a
    policy the user's (None: the framework decides)."""
    if policy is None:
        return given
    if given is not None:
        raise ConfigError(f"{field}={given!r} is invalid with precision_policy={policy!r}: the policy installs "
                          "its own plugin; drop one of them")
    return make()
