"""A heterogeneous cluster on one Linux box: namespaces + tbf links + cgroup CPU quotas (root), or a
labelled simulation on loopback. See docs/emulator.md.

Example::

    from hetero_strategy.emulate import EmulatedCluster

    with EmulatedCluster(compute=[1.0, 0.57], links=["10gbit", "100mbit"]) as cluster:
        result = cluster.run(["python", "train.py"], timeout=600)
"""

from hetero_strategy.emulate.cluster import EmulatedCluster
from hetero_strategy.emulate.launch import RunResult
from hetero_strategy.emulate.spec import ClusterSpec
from hetero_strategy.emulate.stale import clean_stale, leftovers
from hetero_strategy.emulate.system import EmulatorError

__all__ = ["ClusterSpec", "EmulatedCluster", "EmulatorError", "RunResult", "clean_stale", "leftovers"]
