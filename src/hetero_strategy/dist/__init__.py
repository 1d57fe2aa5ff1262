"""Generic distributed helpers shared by every feature (docs/design.md, layers).

Everything here is plain ``torch.distributed`` and knows no feature: the hooks, the balancer, the
precision gate, the hybrid mode and the runtime all stand on it, so none of them reaches into
another for a collective it happened to write first.

Example::

    from hetero_strategy.dist import all_gather_floats, device_for
    rows = all_gather_floats([seconds])          # one row per rank, float64, the same on every rank
"""

from hetero_strategy.dist.bandwidth import allreduce_seconds, measure_bandwidth_gbps
from hetero_strategy.dist.errors import StallError, is_peer_failure, is_peer_gone
from hetero_strategy.dist.gather import all_gather_floats
from hetero_strategy.dist.placement import device_for
from hetero_strategy.dist.reduce import reduce_flat
from hetero_strategy.dist.store import client_store, job_prefix, job_store

__all__ = [
    "StallError",
    "all_gather_floats",
    "allreduce_seconds",
    "client_store",
    "device_for",
    "is_peer_failure",
    "is_peer_gone",
    "job_prefix",
    "job_store",
    "measure_bandwidth_gbps",
    "reduce_flat",
]
