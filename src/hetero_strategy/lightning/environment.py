"""Nodes with different numbers of processes (e.g. 1 GPU on one node, 3 on another).

Lightning checks ``devices x num_nodes == WORLD_SIZE``, which only holds when every node runs
the same number of processes, and refuses the job otherwise. Under torchrun the ranks, the world
size and each node's process count come from the launcher, so the only thing to check is that
this node's ``devices`` matches what torchrun started here.
"""

from __future__ import annotations

import os
from typing import Any

from lightning.fabric.plugins.environments import TorchElasticEnvironment

__all__ = ["UnevenNodesEnvironment", "allow_uneven_nodes", "job_world_size"]


class UnevenNodesEnvironment(TorchElasticEnvironment):
    """TorchElasticEnvironment that accepts nodes of different sizes (ranks come from torchrun)."""

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        local = int(os.environ.get("LOCAL_WORLD_SIZE", num_devices))
        if num_devices != local:
            raise ValueError(f"devices={num_devices} is invalid on this node: torchrun started {local} processes "
                             f"here; pass devices={local} (devices=int(os.environ['LOCAL_WORLD_SIZE'])); nodes may "
                             "differ in size")


def allow_uneven_nodes(environment: Any) -> Any:
    """The environment to use: torchrun's, made tolerant of uneven nodes; any other unchanged."""
    if type(environment) is TorchElasticEnvironment:
        return UnevenNodesEnvironment()
    return environment


def job_world_size(environment: Any, num_nodes: int, num_processes: int) -> int:
    """The job's rank count before the process group exists: torchrun's WORLD_SIZE (nodes may
    differ), else Lightning's devices x num_nodes."""
    if isinstance(environment, TorchElasticEnvironment):
        return environment.world_size()
    return num_nodes * num_processes
