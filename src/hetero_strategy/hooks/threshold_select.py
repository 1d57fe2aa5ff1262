"""Ok-Topk's threshold reuse for the all-gather Top-K exchange (``selection="threshold"``).

Exact selection finds every parameter's k largest |entries| every step, a radix select (or a
sampled sort on the CPU). The k-th magnitude of a gradient plus its residual moves slowly, so
here each parameter keeps a *threshold* and, between re-estimates, sends every entry above it in
one streaming pass (:func:`~hetero_strategy.triton_kernels.dispatch.threshold_select_segments`):

1. a parameter's threshold is estimated as the exact k-th largest finite |acc| of its accumulator
   (:func:`~hetero_strategy.triton_kernels.dispatch.segment_thresholds`) when it has none, when its
   k moved by more than an eighth since the estimate, and every ``every`` of its selections;
2. otherwise the stored threshold is reused: the count sent follows the gradient (more entries
   when magnitudes grow, fewer when they shrink), up to the parameter's payload slots, which the
   plan sizes ``headroom`` times k (:meth:`ThresholdSelector.capacity`); entries past the slots
   stay in the residual, and NaN/inf are always sent first;
3. the count actually sent is returned as a device tensor (never read in the hook), so the
   metrics show a threshold that drifts (``comm/entries_sent``, ``comm/density_sent``).

Error feedback is unchanged: what is not sent stays in the residual, so sent + residual = acc.
Thresholds are kept per parameter by its residual ordinal (:meth:`.memory.ResidualMemory.keys`),
so DDP's bucket rebuild moves nothing, and they are checkpointed with their ages: a resumed run
selects what the uninterrupted run selects.

Example::

    selector = ThresholdSelector(every=10, headroom=1.25)
    cap = selector.capacity(k, n)                               # payload slots of a parameter
    values, indices, sent = selector.select_segments_(acc, keys, offsets, sizes, ks, caps)
"""

from __future__ import annotations

import math
from typing import Any

import torch

from hetero_strategy.config import CompressionConfig
from hetero_strategy.triton_kernels import dispatch

__all__ = ["ThresholdSelector", "selector_for"]

_NOTHING = 2**31 - 1  # a threshold no key exceeds: a segment that sends nothing (k = 0)
# NOTE: re-estimate at once when k moves by more than 1/_K_DRIFT: a cosine step moves k by far
# less (those wait for the period), a tier or schedule change by more
_K_DRIFT = 8


def selector_for(config: CompressionConfig) -> ThresholdSelector | None:
    """The selector of ``config`` (``selection="threshold"``), or None for exact selection."""
    if config.selection != "threshold":
        return None
    return ThresholdSelector(config.threshold_every, config.threshold_headroom)


class ThresholdSelector:
    """Per-parameter thresholds of one rank, reused between exact re-estimates (module docstring).

    Args:
        every: re-estimate a parameter's threshold every this many of its selections (>= 1).
        headroom: payload slots per planned entry (>= 1), room for a threshold that lets more
            than k through.
    """

    __slots__ = ("every", "headroom", "thresholds", "targets", "ages")

    def __init__(self, every: int = 10, headroom: float = 1.25) -> None:
        self.every, self.headroom = every, headroom
        self.thresholds: dict[int, torch.Tensor] = {}  # key -> 0-d int32 |acc| key: send what exceeds it
        self.targets: dict[int, int] = {}  # key -> the k the threshold was estimated for
        self.ages: dict[int, int] = {}  # key -> selections since that estimate

    def capacity(self, k: int, n: int) -> int:
        """Payload slots of a parameter of ``n`` entries whose planned k (the largest over ranks) is ``k``."""
        return min(n, math.ceil(self.headroom * k))

    def _stale(self, key: int, k: int) -> bool:
        target = self.targets.get(key)
        return (target is None or abs(k - target) * _K_DRIFT > target
                or self.ages.get(key, 0) >= self.every)

    def select_segments_(self, acc: torch.Tensor, keys: list[int], offsets: list[int], sizes: list[int],
                         ks: list[int], caps: list[int], backend: str = "auto"
                         ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Like :meth:`~hetero_strategy.hooks.codecs.TopKCodec.select_segments_` (values and
        bucket-relative indices (sum caps,), sent entries of ``acc`` zeroed in place), plus the
        (S,) int32 device count each segment actually sent. ``keys``: the segments' residual
        ordinals; ``ks[s] = 0``: the segment sends nothing and keeps its threshold."""
        live = [j for j, k in enumerate(ks) if k > 0]
        stale = [j for j in live if self._stale(keys[j], ks[j])]
        if stale:  # the exact k-th magnitudes, one estimate per stale segment
            fresh = dispatch.segment_thresholds(acc, [offsets[j] for j in stale], [sizes[j] for j in stale],
                                                [ks[j] for j in stale], backend=backend)
            for i, j in enumerate(stale):
                self.thresholds[keys[j]], self.targets[keys[j]], self.ages[keys[j]] = fresh[i], ks[j], 0
        nothing = torch.full((), _NOTHING, dtype=torch.int32, device=acc.device)
        thresholds = torch.stack([self._threshold(keys[j], acc.device) if k > 0 else nothing
                                  for j, k in enumerate(ks)]) if ks else nothing.new_empty(0)  # (S,) int32
        for j in live:
            self.ages[keys[j]] += 1
        return dispatch.threshold_select_segments(acc, offsets, sizes, thresholds, caps, backend=backend)

    def _threshold(self, key: int, device: torch.device) -> torch.Tensor:
        t = self.thresholds[key]
        if t.device != device:  # loaded from a checkpoint: moved once
            t = self.thresholds[key] = t.to(device)
        return t

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        return {"thresholds": {k: int(v) for k, v in self.thresholds.items()}, "targets": dict(self.targets),
                "ages": dict(self.ages)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.thresholds = {int(k): torch.tensor(int(v), dtype=torch.int32) for k, v in state.get("thresholds", {}).items()}
        self.targets = {int(k): int(v) for k, v in state.get("targets", {}).items()}
        self.ages = {int(k): int(v) for k, v in state.get("ages", {}).items()}
