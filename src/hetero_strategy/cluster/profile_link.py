"""What a ``hetero-strategy profile`` JSON says of its link, for the planner (cluster/spec.py)."""

from __future__ import annotations

from hetero_strategy.cluster.cost import Link
from hetero_strategy.config.errors import _number

__all__ = ["measured_link", "wire_share"]


def measured_link(doc: dict) -> Link:
    """A profile's link: what its largest all-reduce measured (the collective the cost model times,
    with the reduction's own work in it, which on gloo is CPU time), else its slowest rank's
    point-to-point bandwidth. Its latency: the smallest all-reduce's mean time, spread over the
    ring's hops; NOTE: the mean, not the latency probe's median: a step's collectives also wait
    for peers that the scheduler has paused (a CPU quota's period, another process), and the
    sweep's mean pays that as they do. The probe's median stands in where there is no sweep."""
    ranks = doc["ranks"]
    hops = 2 * max(len(ranks) - 1, 1)
    latency = [(r.get("latency_us") or {}).get("p50_us") for r in ranks]
    latency = [x for x in latency if _number(x)]
    latency_s = max(latency) * 1e-6 if latency else 20e-6 * hops
    sweep = [row for row in doc.get("allreduce") or [] if isinstance(row, dict) and _number(row.get("algbw_gbit_s"))]
    if sweep and len(ranks) > 1:
        smallest = min(sweep, key=lambda row: row.get("bytes") or 0)
        latency_s = max(latency_s, smallest["time_s"]) if _number(smallest.get("time_s")) else latency_s
        biggest = max(sweep, key=lambda row: row.get("bytes") or 0)
        return Link.from_allreduce(biggest["algbw_gbit_s"] * 1e9 / 8, len(ranks), latency_s)
    gbit = [r["bandwidth_gbit_s"] for r in ranks if r.get("bandwidth_gbit_s")]
    return Link(min(gbit) * 1e9 / 8 if gbit else 1e9 / 8, latency_s / hops)


def wire_share(doc: dict) -> float | None:
    """busbw of the largest all-reduce / the slowest rank's point-to-point bandwidth, at most 1."""
    sweep = [row for row in doc.get("allreduce") or [] if isinstance(row, dict) and _number(row.get("busbw_gbit_s"))]
    p2p = [r.get("bandwidth_gbit_s") for r in doc["ranks"]]
    if not sweep or not all(_number(b) and b > 0 for b in p2p):
        return None
    return min(1.0, max(sweep, key=lambda row: row.get("bytes") or 0)["busbw_gbit_s"] / min(p2p))
