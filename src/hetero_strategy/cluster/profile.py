"""Cluster profile: run the probes on every rank, gather them, classify tiers, read/write JSON.

Schema (``"schema": "hetero_strategy.cluster_profile/1"``; see docs/profiler.md)::

    {"schema", "created", "world_size", "backend", "emulated",
     "ranks": [{"rank", "device": {...}, "training_dtype", "matmul_tflops": {"fp32", "bf16", "fp16"},
                "memory_gbps", "compute_score", "bandwidth_gbit_s", "tier",
                "latency_us": {"p50_us", "p99_us", ...}}],
     "allreduce": [{"bytes", "time_s", "algbw_gbit_s", "busbw_gbit_s"}],
     "p2p_gbit_s": [[null, 9.1], [8.7, null]]}

Example::

    profile = run_profile(max_bytes=1 << 20)   # under torchrun / emulate, or single process
    save_profile(profile, "cluster.json")
    inputs = load_profile("cluster.json")
    split_batch(256, capacity(inputs.compute, inputs.bandwidth_gbit_s))
"""

from __future__ import annotations

import datetime
import json
import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.cluster import probes
from hetero_strategy.cluster.devices import DeviceInfo, describe_device, training_dtype
from hetero_strategy.cluster.tiers import classify_tier
from hetero_strategy.config.errors import shown

__all__ = ["SCHEMA", "ProfileInputs", "load_profile", "read_profile", "run_profile", "save_profile"]

SCHEMA = "hetero_strategy.cluster_profile/1"


@dataclass(frozen=True)
class ProfileInputs:
    """What the planner reads from a profile: one entry per rank."""

    compute: list[float]
    """Relative compute score (training-dtype matmul throughput / the fastest rank's)."""
    bandwidth_gbit_s: list[float]
    """Best measured point-to-point bandwidth of each rank (all-reduce busbw when single-process)."""
    tiers: list[str]


def run_profile(*, max_bytes: int = 256 << 20, p2p_bytes: int = 4 << 20, matmul_n: int = 1024,
                budget_s: float = 0.3, latency_iters: int = 200,
                extra: Callable[[], dict[str, Any]] | None = None) -> dict[str, Any]:
    """Profile every rank of the job (initialising gloo/nccl from the torchrun environment if needed).

    ``extra``: more measurements of this rank, merged into its entry (e.g. ``model_step``, a
    model's step timed by the command); called on every rank, after the link probes.
    """
    owned = _init_from_env()
    try:
        world = dist.get_world_size() if dist.is_initialized() else 1
        device = _device()
        info = describe_device()
        mine: dict[str, Any] = {
            "rank": dist.get_rank() if dist.is_initialized() else 0, "device": info,
            "training_dtype": training_dtype(DeviceInfo.from_facts(info)),
            "matmul_tflops": probes.matmul_all(device, matmul_n, budget_s),
            "memory_gbps": probes.memory_gbps(device, budget_s=budget_s),
        }
        sweep, p2p = [], [[None]]
        if world > 1:
            sweep = probes.allreduce_sweep(probes.sweep_sizes(max_bytes=max_bytes), budget_s)
            p2p = probes.p2p_matrix(device, p2p_bytes)
            mine["latency_us"] = probes.allreduce_latency(device, latency_iters)
        if extra is not None:
            mine.update(extra())
        ranks = _gather(mine, world)
        if owned:
            dist.barrier()  # NOTE: gloo aborts a process whose peer hung up mid-exchange; leave together
        return _assemble(ranks, sweep, p2p, world)
    finally:
        if owned:
            dist.destroy_process_group()


def _assemble(ranks: list[dict], sweep: list[dict], p2p: list[list], world: int) -> dict[str, Any]:
    scores = [r["matmul_tflops"].get(r["training_dtype"]) or r["matmul_tflops"]["fp32"] for r in ranks]
    best = max(scores)
    for k, r in enumerate(ranks):
        r["compute_score"] = scores[k] / best
        peers = [v for v in p2p[k] + [row[k] for row in p2p] if v is not None]
        # A rank's link is as fast as its best peer sees it (a slow peer limits only its own pair).
        bw = max(peers) if peers else (sweep[-1]["busbw_gbit_s"] if sweep else None)
        r["bandwidth_gbit_s"] = bw
        nvlink = bool(r["device"].get("nvlink_links"))
        r["tier"] = classify_tier(bw, nvlink=nvlink) if bw is not None else ("nvlink" if nvlink else None)
    return {
        "schema": SCHEMA, "created": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "world_size": world, "backend": dist.get_backend() if dist.is_initialized() else None,
        "emulated": os.environ.get("HETERO_EMULATED"), "ranks": ranks, "allreduce": sweep, "p2p_gbit_s": p2p,
    }


def save_profile(profile: dict[str, Any], path: str | Path) -> None:
    from hetero_strategy.config.files import write_atomic

    write_atomic(path, json.dumps(profile, indent=2))


def load_profile(path: str | Path) -> ProfileInputs:
    """Read a profile JSON and return the balance planner's inputs.

    Raises:
        ConfigError: as :func:`read_profile`.
    """
    ranks = read_profile(path)
    bw = [r.get("bandwidth_gbit_s") for r in ranks]
    if any(b is None for b in bw):  # single-process profile: no link measured, so no link preference
        bw = [1.0] * len(ranks)
    return ProfileInputs(compute=[float(r["compute_score"]) for r in ranks],
                         bandwidth_gbit_s=[float(b) for b in bw], tiers=[r.get("tier") or "eth1g" for r in ranks])


def read_profile(path: str | Path, whole: bool = False) -> Any:
    """A profile JSON's rank entries, checked and sorted by rank (the raw measurements); with
    ``whole``, the checked document (its ``ranks`` sorted).

    Raises:
        ConfigError: ``profile='<path>' is invalid: ...`` naming what is wrong (unreadable, not
            JSON, another schema, a rank's field) and the fix.
    """
    from hetero_strategy.config import ConfigError

    def refuse(why: str) -> ConfigError:
        return ConfigError(f"profile={str(path)!r} is invalid: {why}; re-run `hetero-strategy profile --json PATH`")

    try:
        data = json.loads(Path(path).read_bytes())  # NOTE: bytes: json detects UTF-8/16/32 itself
    except (OSError, ValueError) as e:  # ValueError: a NUL in the path
        if isinstance(e, json.JSONDecodeError):
            raise refuse(f"not JSON at line {e.lineno} (a truncated or hand-edited file?)") from None
        if isinstance(e, UnicodeDecodeError):
            raise refuse("not UTF-8 text") from None
        raise refuse(f"cannot read it ({getattr(e, 'strerror', None) or e})") from None
    except RecursionError:
        raise refuse("nested too deeply to be a profile") from None
    if not isinstance(data, dict) or data.get("schema") != SCHEMA:
        schema = data.get("schema") if isinstance(data, dict) else None
        raise refuse(f"schema {shown(schema)} is not {SCHEMA!r}")
    ranks = data.get("ranks")
    if not isinstance(ranks, list) or not ranks:
        raise refuse(f"ranks={shown(ranks)}: give one entry per rank")
    why = _rank_problem(ranks)
    if why:
        raise refuse(why)
    ranks = sorted(ranks, key=lambda r: r["rank"])
    return dict(data, ranks=ranks) if whole else ranks


def _rank_problem(ranks: list[Any]) -> str | None:
    """What is wrong with the first bad rank entry, or None: the ranks are 0..n-1 once each, each
    with a compute score > 0, a link bandwidth > 0 (or null: not measured) and a known tier."""
    from hetero_strategy.config import TIERS
    from hetero_strategy.config.errors import _number, _whole

    seen: set[int] = set()
    for i, r in enumerate(ranks):
        if not isinstance(r, dict):
            return f"ranks[{i}]={shown(r)}: each rank is a mapping of its measurements"
        k, score, bw, tier = r.get("rank"), r.get("compute_score"), r.get("bandwidth_gbit_s"), r.get("tier")
        if not _whole(k) or not 0 <= k < len(ranks) or k in seen:
            return f"ranks[{i}].rank={shown(k)}: the ranks must be 0..{len(ranks) - 1}, each once"
        seen.add(k)
        if not _number(score) or score <= 0:
            return f"ranks[{i}].compute_score={shown(score)}: give the rank's speed as a number > 0"
        if bw is not None and (not _number(bw) or bw <= 0):
            return f"ranks[{i}].bandwidth_gbit_s={shown(bw)}: give the link's Gbit/s as a number > 0, or null"
        if tier is not None and tier not in TIERS:
            return f"ranks[{i}].tier={shown(tier)}: choose one of {', '.join(TIERS)}, or null"
    return None


def _init_from_env() -> bool:
    if dist.is_initialized() or int(os.environ.get("WORLD_SIZE", "1")) <= 1:
        return False
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    if backend == "nccl":
        torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=300))
    return True


def _device() -> torch.device:
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    return torch.device("cpu")


def _gather(mine: dict[str, Any], world: int) -> list[dict[str, Any]]:
    if world == 1:
        return [mine]
    out: list[Any] = [None] * world
    dist.all_gather_object(out, mine)
    return out
