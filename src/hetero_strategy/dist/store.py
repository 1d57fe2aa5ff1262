"""The job's key-value store: one prefix rule for every object that keeps keys in it.

Keys carry the elastic restart count because an agent's store outlives the workers it restarts:
an earlier attempt's keys must not answer this attempt's reads.
"""

from __future__ import annotations

import collections
import datetime
import itertools
import logging
import os

import torch.distributed as dist

__all__ = ["client_store", "job_prefix", "job_store"]

log = logging.getLogger("hetero_strategy")

_INSTANCES: collections.defaultdict[str, itertools.count] = collections.defaultdict(itertools.count)


def job_prefix(kind: str) -> str:
    """The key prefix of ``kind`` (``hybrid``, ``ckpt``, ``heartbeat``) in this restart attempt."""
    return f"hetero/{kind}/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/"


def job_store(kind: str) -> dist.Store:
    """A namespace of the default group's rendezvous store for one object of ``kind``.

    The default group's own store works with every init method (env://, tcp://, file://); a
    number per object keeps another object's keys out. Every rank must build its objects of a
    kind in the same order.

    Example::

        store = job_store("ckpt")      # store.set("due", b"1") on rank 0, store.get("due") elsewhere
    """
    return dist.PrefixStore(f"{job_prefix(kind)}{next(_INSTANCES[kind])}/",
                            dist.distributed_c10d._get_default_store())


def client_store(timeout_s: float, kind: str) -> dist.Store | None:
    """A connection of this rank's own to ``MASTER_ADDR:MASTER_PORT``, under ``job_prefix(kind)``.

    Its short timeout lets a reader give up on a frozen store host (rank 0 under a one-node
    launch) instead of hanging with it. None when the launch names no store address or the store
    refuses the connection (logged): callers then work without it.
    """
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if not addr or not port:
        return None
    try:
        tcp = dist.TCPStore(addr, int(port), is_master=False, timeout=datetime.timedelta(seconds=timeout_s),
                            wait_for_workers=False)
    except Exception as e:  # noqa: BLE001 - callers degrade: the heartbeat's errors come without rank names
        log.warning("hetero: no %s store (the store at %s:%s refused a connection: %s)", kind, addr, port, e)
        return None
    return dist.PrefixStore(job_prefix(kind), tcp)
