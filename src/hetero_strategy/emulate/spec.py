"""What an emulated cluster looks like: per-rank compute factor, link rate and queueing latency."""

from __future__ import annotations

from dataclasses import dataclass, field

from hetero_strategy.cluster.tiers import classify_tier, parse_rate

__all__ = ["ClusterSpec", "parse_float_list", "parse_link_list"]

_UNSHAPED = ("none", "unlimited", "")


@dataclass(kw_only=True, slots=True)
class ClusterSpec:
    """Validated description of an emulated cluster.

    Example::

        spec = ClusterSpec(compute=[1.0, 0.57], links=["10gbit", "100mbit"])
        spec.rates_bps  # [1e10, 1e8]
    """

    compute: list[float]
    """Per-rank share of one CPU core (1.0 = a full core, 0.57 = 57% quota)."""
    links: list[str] | None = None
    """Per-rank link rate in tc spelling ("10gbit", "100mbit"), "none" for unshaped; one entry
    applies to every rank; None leaves every link unshaped."""
    latency_ms: list[float] | None = None
    """Per-rank tbf queueing-latency bound in ms (netem is unavailable, so this is not a fixed delay)."""
    simulate: bool = False
    """Run on loopback with an in-process compute slowdown instead of namespaces and cgroups."""
    rates_bps: list[float | None] = field(init=False, default_factory=list)

    def __post_init__(self) -> None:
        if not isinstance(self.compute, (list, tuple)) or not self.compute:
            raise ValueError(f"compute={self.compute!r} is invalid: give one factor per rank, e.g. 1.0,0.57")
        n = len(self.compute)
        for i, c in enumerate(self.compute):
            if isinstance(c, bool) or not isinstance(c, (int, float)) or not 0.01 <= c <= 1.0:
                raise ValueError(f"compute[{i}]={c!r} is invalid: a rank gets one pinned core, so its factor "
                                 "must lie in [0.01, 1.0] (1.0 = a full core)")
        links = ["none"] * n if self.links is None else list(self.links)
        if len(links) == 1:
            links = links * n
        if len(links) != n:
            raise ValueError(f"links={self.links!r} is invalid: give 1 or {n} entries (one per rank)")
        self.links = links
        self.rates_bps = [None if str(x).strip().lower() in _UNSHAPED else parse_rate(x) for x in links]
        lat = [50.0] if self.latency_ms is None else list(self.latency_ms)
        if len(lat) == 1:
            lat = lat * n
        if len(lat) != n or any(isinstance(v, bool) or not isinstance(v, (int, float)) or v <= 0 for v in lat):
            raise ValueError(f"latency={self.latency_ms!r} is invalid: give 1 or {n} positive values in ms")
        self.latency_ms = [float(v) for v in lat]

    @property
    def nproc(self) -> int:
        return len(self.compute)

    def tier(self, rank: int) -> str | None:
        """The link tier a rank's configured rate falls in (None when unshaped)."""
        rate = self.rates_bps[rank]
        return None if rate is None else classify_tier(rate / 1e9)


def parse_float_list(text: str, name: str) -> list[float]:
    """"1.0,0.57" -> [1.0, 0.57]; the error names the option."""
    try:
        return [float(x) for x in str(text).split(",") if x.strip()]
    except ValueError as e:
        raise ValueError(f"{name}={text!r} is invalid: give comma-separated numbers, e.g. 1.0,0.57") from e


def parse_link_list(text: str | None) -> list[str] | None:
    return None if text is None else [x.strip() for x in str(text).split(",")]
