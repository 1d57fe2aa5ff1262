"""What a cluster profile proposes as the wizard's defaults: per-rank tiers, capacities, compression.

The numbers come from the layers below (``cluster.profile.load_profile`` reads the measurement,
``balance.shares.capacity`` turns it into capacities); this module only rounds them for display and
picks the compression method that fits the links.

Example::

    p = propose("cluster.json")
    p.tiers, p.capacities, p.compression     # (['ib', 'eth1g'], [0.765, 0.235], 'tiered')
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

__all__ = ["DENSE_TIERS", "Proposal", "propose", "propose_compression"]

# Tiers whose links are fast enough that compression only costs accuracy (docs/design.md semantics 8).
DENSE_TIERS = frozenset({"nvlink"})


@dataclass(frozen=True)
class Proposal:
    """The defaults a profile proposes, one entry per rank."""

    path: str
    tiers: list[str]
    capacities: list[float]
    compression: str

    def describe(self) -> str:
        caps = ", ".join(f"{c:g}" for c in self.capacities)
        return (f"profile {self.path}: tiers {', '.join(self.tiers)}; capacities {caps}; "
                f"proposed compression {self.compression}")


def propose_compression(tiers: Sequence[str] | None) -> str:
    """none when every link is dense or nothing is known; tiered as soon as one rank sits on a slower tier.

    tiered rather than topk even for one uniform slow tier, because tiered takes the density,
    exchange period and error-feedback strength of each tier (docs/design.md semantics 8) instead of one
    setting for all.
    """
    if not tiers or all(t in DENSE_TIERS for t in tiers):
        return "none"
    return "tiered"


def propose(path: str | Path) -> Proposal:
    """Read a profile JSON (``hetero-strategy profile --json``) and propose the defaults from it."""
    return _propose(str(path), Path(path).stat().st_mtime_ns)


@functools.lru_cache(maxsize=8)
def _propose(path: str, mtime_ns: int) -> Proposal:
    # NOTE: cached by modification time: several questions read the same profile in one run.
    from hetero_strategy.balance.shares import capacity
    from hetero_strategy.cluster.profile import load_profile

    inputs = load_profile(path)
    caps = capacity(inputs.compute, inputs.bandwidth_gbit_s)
    # Three decimals keep hetero.yaml readable; the floor keeps a very slow rank's capacity positive.
    rounded = [max(round(c, 3), 0.001) for c in caps]
    return Proposal(path=path, tiers=list(inputs.tiers), capacities=rounded,
                    compression=propose_compression(inputs.tiers))
