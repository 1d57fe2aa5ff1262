"""What every rank of a benchmark worker does around its job: one gloo group, rank 0 writes the JSON."""

from __future__ import annotations

import datetime
import json
from collections.abc import Callable

import torch
import torch.distributed as dist

__all__ = ["gloo_job"]


def gloo_job(out: str, job: Callable[[], dict], timeout_s: float = 300) -> int:
    """Run ``job`` on this rank (one CPU thread, gloo from the torchrun environment); rank 0
    writes its result to ``out``; the group is destroyed whatever happens."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    try:
        result = job()
        if dist.get_rank() == 0:
            with open(out, "w") as f:
                json.dump(result, f)
    finally:
        dist.destroy_process_group()
    return 0
