"""Cluster model: devices, probes (matmul, memory bandwidth, all-reduce, p2p), link tiers, profile JSON."""

from hetero_strategy.cluster.tiers import TIER_THRESHOLDS_GBIT, classify_tier, parse_rate

__all__ = ["TIER_THRESHOLDS_GBIT", "classify_tier", "parse_rate"]
