"""The precision section: which autocast dtype each rank uses, and the coordinated loss scaler."""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from difflib import get_close_matches
from typing import Any

from hetero_strategy.config.errors import _fail, _number, _plain, _whole

__all__ = ["CAPABILITY_KEY", "DTYPE_NAMES", "PrecisionConfig", "name_words"]

DTYPE_NAMES = ("bf16", "fp16", "fp32")
CAPABILITY_KEY = re.compile(r"^\d+\.\d$")  # a compute capability, major.minor


def name_words(text: str) -> tuple[str, ...]:
    """A device name, or a mapping key's name part, as the words the policy matches."""
    return tuple(re.findall(r"[a-z0-9]+", text.lower()))


@dataclass(kw_only=True, slots=True)
class PrecisionConfig:
    """Per-device mixed precision (docs/design.md semantics 9); see docs/strategy.md.

    ``precision_policy`` None leaves precision to the framework (Lightning's ``precision=``,
    Accelerate's ``mixed_precision``), as before. Any other value makes hetero_strategy own it:
    parameters and optimizer state stay fp32 everywhere, each rank autocasts in its dtype, and only
    fp16 ranks scale their loss, with one scale history for every fp16 rank.
    """

    precision_policy: str | list[str] | dict[str, str] | None = None
    """None (the framework decides); "auto" (bf16 on compute capability >= 8.0, fp16 + loss scaling
    on 7.x, fp32 below and on CPU); one of bf16/fp16/fp32 for every rank; a list with one per rank;
    or a mapping from a device-name part ("V100", "RTX 3090": whole words of the name) or a
    capability ("7.0") to a dtype, with an optional "default" key (else "auto" decides). A name
    part wins over a capability, and the longest matching part over shorter ones."""
    keep_fp32: list[str] = field(default_factory=lambda: ["LayerNorm", "Softmax"])
    """Module class names that always run in fp32 under autocast."""
    init_scale: float = 2.0**16
    """First loss scale of fp16 ranks."""
    growth_factor: float = 2.0
    """Scale multiplier after ``growth_interval`` steps without an overflow."""
    backoff_factor: float = 0.5
    """Scale multiplier after a step with an overflow on any rank (the step is skipped)."""
    growth_interval: int = 2000
    """Overflow-free steps before the scale grows."""

    def __post_init__(self) -> None:
        policy = self.precision_policy
        if isinstance(policy, str):
            if policy != "auto" and policy not in DTYPE_NAMES:
                _fail("precision_policy", policy, f"use auto, one of {', '.join(DTYPE_NAMES)}, a per-rank list "
                      "or a mapping device-name/capability -> dtype")
        elif isinstance(policy, (list, tuple)):
            if not policy:
                _fail("precision_policy", policy, "give one dtype per rank, e.g. ['bf16', 'fp32']")
            for i, v in enumerate(policy):
                if v not in DTYPE_NAMES:
                    _fail(f"precision_policy[{i}]", v, f"use one of {', '.join(DTYPE_NAMES)}")
        elif isinstance(policy, dict):
            keys = [_policy_key(k) for k in policy]
            same = [name_words(k) if not CAPABILITY_KEY.match(k) else k for k in keys]
            if len(set(same)) != len(same):
                _fail("precision_policy", policy, "two keys name the same capability or device-name part; keep one")
            self.precision_policy = dict(zip(keys, policy.values()))
            for key, v in self.precision_policy.items():
                if v not in (*DTYPE_NAMES, "auto"):
                    _fail(f"precision_policy.{key}", v, f"use auto or one of {', '.join(DTYPE_NAMES)}")
        elif policy is not None:
            _fail("precision_policy", policy, "use None, auto, a dtype name, a per-rank list or a mapping")
        if not isinstance(self.keep_fp32, (list, tuple)) or not all(isinstance(n, str) for n in self.keep_fp32):
            _fail("keep_fp32", self.keep_fp32, "give a list of module class names, e.g. ['LayerNorm', 'Softmax']")
        self._check_positive("init_scale", self.init_scale)
        if not _number(self.growth_factor) or self.growth_factor < 1:
            _fail("growth_factor", self.growth_factor, "must be a number >= 1 (1 never grows)")
        if not _number(self.backoff_factor) or not 0 < self.backoff_factor < 1:
            _fail("backoff_factor", self.backoff_factor, "must lie in (0, 1), e.g. 0.5")
        if not _whole(self.growth_interval) or self.growth_interval < 1:
            _fail("growth_interval", self.growth_interval, "must be an integer >= 1, e.g. 2000")
        _plain(self)

    @staticmethod
    def _check_positive(name: str, value: Any) -> None:
        if not _number(value) or not value > 0:
            _fail(name, value, "must be a positive number")


def _policy_key(key: Any) -> str:
    """A mapping key as the policy reads it: "default", a capability "M.m" (YAML's unquoted 7.0 is
    a float), or a device-name part; anything else is refused here rather than never matching."""
    if isinstance(key, float) and 0 <= key < 1000 and abs(key * 10 - round(key * 10)) < 1e-6:  # NOTE: round(inf) raises
        key = f"{key:.1f}"  # one decimal: 8.6 -> "8.6", 7.95 is no capability
    if isinstance(key, str):
        key = key.strip()
    if not isinstance(key, str) or not key:
        _fail("precision_policy key", key, "use a device-name part ('V100'), a compute capability major.minor "
              "(7.0, not 7) or 'default'")
    if CAPABILITY_KEY.match(key) or key == "default":
        return key
    if get_close_matches(key.lower(), ["default"], n=1, cutoff=0.75):
        _fail("precision_policy key", key, "did you mean 'default'?")
    if not re.search(r"[A-Za-z]", key):
        _fail("precision_policy key", key, "a capability is major.minor ('7.0', not '7'); a device-name part "
              "has a letter ('V100', 'RTX 3090')")
    return key
