"""``EmulatedCluster``: a heterogeneous cluster on one Linux box, built on enter and removed on exit.

Real isolation (root): a network namespace per rank (or per node, with ``nodes=``) joined by a
bridge, each namespace's veth shaped with ``tc tbf`` in both directions, a cgroup CPU quota per
rank, one pinned core and one thread per rank.
``simulate=True`` (no root needed): loopback, unshaped, and a SIGSTOP/SIGCONT duty cycle for compute.

The cluster composes the emulator's parts: :mod:`~hetero_strategy.emulate.netns` (namespaces and
links), :mod:`~hetero_strategy.emulate.system` (cgroups), :mod:`~hetero_strategy.emulate.launch`
(ranks, restarts), :mod:`~hetero_strategy.emulate.linkprobe` (link measurement) and
:mod:`~hetero_strategy.emulate.stale` (what dead runs left behind).

Example::

    with EmulatedCluster(compute=[1.0, 0.57], links=["10gbit", "100mbit"]) as cluster:
        print(cluster.describe())
        result = cluster.run([sys.executable, "train.py"], timeout=600)
        assert result.ok, result.outputs

    # two nodes of different sizes: rank 0 alone, ranks 1-2 sharing a namespace (torchrun's
    # GROUP_RANK / LOCAL_RANK / LOCAL_WORLD_SIZE per node), one link per node
    with EmulatedCluster(compute=[1.0, 0.5, 0.5], nodes=[1, 2], links=["10gbit", "1gbit"]) as cluster:
        ...
"""

from __future__ import annotations

import atexit
import itertools
import os
import shutil
import subprocess
from collections.abc import Callable, Sequence

from typing_extensions import Self

from hetero_strategy.balance.memory import MEMORY_LIMIT_ENV
from hetero_strategy.cluster.tiers import parse_rate
from hetero_strategy.dist.ports import free_port
from hetero_strategy.emulate import netns
from hetero_strategy.emulate.launch import RankProcess, RunResult, run_with_restarts, supervise
from hetero_strategy.emulate.linkprobe import measure_uploads
from hetero_strategy.emulate.spec import ClusterSpec
from hetero_strategy.emulate.stale import clean_stale
from hetero_strategy.emulate.system import CpuCgroup, EmulatorError, MemoryCgroup, is_root

__all__ = ["EmulatedCluster"]

_COUNTER = itertools.count()
_MASTER_PORT = 29500  # every emulated cluster has fresh namespaces, so the default port is free


class EmulatedCluster:
    """N ranks with their own compute quota and link rate (see the module docstring)."""

    def __init__(self, compute: Sequence[float], links: Sequence[str] | None = None,
                 latency_ms: Sequence[float] | None = None, simulate: bool = False, measure: bool = True,
                 nodes: Sequence[int] | None = None, mtu: int = 1500, memory: Sequence[str] | None = None) -> None:
        self.spec = ClusterSpec(compute=list(compute), links=None if links is None else list(links),
                                latency_ms=None if latency_ms is None else list(latency_ms), simulate=simulate,
                                nodes=None if nodes is None else list(nodes), mtu=mtu,
                                memory=None if memory is None else list(memory))
        self.measure = measure
        self.tag = f"{os.getpid()}-{next(_COUNTER)}"
        cpus = sorted(os.sched_getaffinity(0))
        self.cores = [cpus[k % len(cpus)] for k in range(self.spec.nproc)]  # N > cores: ranks share
        self.nets: list[netns.RankNet] = []
        self.cgroups: list[CpuCgroup] = []
        self.memory_cgroups: list[MemoryCgroup | None] = []
        self.measured_mbit: list[float | None] = [None] * self.spec.nproc
        self.stale_removed: list[str] = []
        self._open = False

    @property
    def mode(self) -> str:
        return "simulated" if self.spec.simulate else "namespaces"

    # ---- lifecycle ---------------------------------------------------------------------
    def __enter__(self) -> Self:
        self.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self) -> None:
        if self.spec.simulate:
            self._open = True
            return
        if not is_root():
            raise EmulatorError("real isolation needs root (network namespaces, tc, cgroups): run as root, "
                                "or pass --simulate (simulate=True) for an unshaped loopback run with a "
                                "simulated compute slowdown")
        self.stale_removed = clean_stale()
        self._open = True
        atexit.register(self.close)  # also on sys.exit / unhandled exceptions; SIGKILL is left to clean_stale
        try:
            firsts = self.spec.node_firsts  # one namespace per node (per rank without nodes=)
            per_ns = netns.build_network(self.tag, [self.spec.rates_bps[k] for k in firsts],
                                         [self.spec.latency_ms[k] for k in firsts], self.spec.mtu)
            self.nets = [per_ns[self.spec.node_of[k]] for k in range(self.spec.nproc)]
            self.cgroups = [CpuCgroup(f"{netns.PREFIX}{self.tag}-r{k}", f) for k, f in enumerate(self.spec.compute)]
            # with any limit, every rank gets a memory cgroup ("none": accounting only, for its peak)
            self.memory_cgroups = [MemoryCgroup(f"{netns.PREFIX}{self.tag}-r{k}", b) if self.spec.memory else None
                                   for k, b in enumerate(self.spec.memory_bytes)]
            if self.measure:
                self.measured_mbit = self.measure_links()
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        """Remove everything this cluster created (idempotent, safe to call from atexit)."""
        if not self._open:
            return
        self._open = False
        atexit.unregister(self.close)
        errors = []
        for cg in [*self.cgroups, *(m for m in self.memory_cgroups if m is not None)]:
            try:
                cg.remove()
            except EmulatorError as e:
                errors.append(str(e))
        netns.remove_network(self.tag, [n.netns for n in self.nets])  # a partially built one too
        self.cgroups, self.memory_cgroups, self.nets = [], [], []
        if errors:
            raise EmulatorError("; ".join(errors))

    def set_link(self, rank: int, link: str) -> None:
        """Change the link of ``rank``'s namespace to ``link`` (e.g. "50mbit") while ranks run: a flap."""
        if self.spec.simulate or not self._open:
            raise EmulatorError("set_link needs a started cluster with real namespaces (not --simulate)")
        node = self.spec.node_of[rank]
        netns.shape(self.tag, node, parse_rate(link), self.spec.latency_ms[rank])

    # ---- running -----------------------------------------------------------------------
    def rank_env(self, rank: int, world: Sequence[int], extra: dict[str, str] | None = None) -> dict[str, str]:
        """torchrun-compatible environment of ``rank`` in a job made of the cluster ranks ``world``."""
        idx = list(world).index(rank)
        master = "127.0.0.1" if self.spec.simulate else self.nets[world[0]].addr
        port = free_port() if self.spec.simulate else _MASTER_PORT
        node_of = self.spec.node_of
        # torchrun's per-node view: without nodes= every rank is on one node; with it, the job's nodes
        # in order of their first rank
        job_nodes = [0] if self.spec.nodes is None else list(dict.fromkeys(node_of[r] for r in world))
        peers = list(world) if self.spec.nodes is None else [r for r in world if node_of[r] == node_of[rank]]
        group = 0 if self.spec.nodes is None else job_nodes.index(node_of[rank])
        env = dict(os.environ)
        env.update(
            RANK=str(idx), LOCAL_RANK=str(peers.index(rank)), GROUP_RANK=str(group), NODE_RANK=str(group),
            ROLE_RANK=str(idx), WORLD_SIZE=str(len(world)), LOCAL_WORLD_SIZE=str(len(peers)),
            ROLE_WORLD_SIZE=str(len(world)), GROUP_WORLD_SIZE=str(len(job_nodes)),
            MASTER_ADDR=master, MASTER_PORT=str(port), TORCHELASTIC_RUN_ID=f"hsem-{self.tag}",
            GLOO_SOCKET_IFNAME="lo" if self.spec.simulate else netns.RANK_IFNAME,
            OMP_NUM_THREADS="1", MKL_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", PYTHONUNBUFFERED="1",
            HETERO_EMULATED=self.mode, HETERO_COMPUTE_FACTOR=f"{self.spec.compute[rank]:g}",
            HETERO_LINK=str(self.spec.links[rank]),
        )
        if self.spec.simulate:
            env["HETERO_SIMULATE_COMPUTE"] = f"{self.spec.compute[rank]:g}"
        memory = self.memory_cgroups[rank] if self.memory_cgroups else None
        env.pop(MEMORY_LIMIT_ENV, None)
        if memory is not None and memory.limit_bytes is not None:
            # NOTE: for a rank that cannot see its cgroup (started by `ip netns exec`, see _argv)
            env[MEMORY_LIMIT_ENV] = str(memory.limit_bytes)
        tier = self.spec.tier(rank)
        if tier is not None and "HETERO_TIER" not in os.environ:
            env["HETERO_TIER"] = tier
        env.update(extra or {})
        return env

    def run(self, argv: Sequence[str], timeout: float = 3600.0, env: dict[str, str] | None = None,
            ranks: Sequence[int] | None = None, capture: bool = True, max_restarts: int = 0,
            on_restart: Callable[[RunResult, int], None] | None = None) -> RunResult:
        """Run ``argv`` once per rank (all ranks, or the job made of ``ranks``); see :func:`supervise`.

        ``max_restarts``: as ``torchrun --max-restarts``, a failed rank stops every rank and the
        whole job starts again, at most this many times, with ``TORCHELASTIC_RESTART_COUNT`` set
        (a job with ``resume="auto"`` checkpoints continues where it was). ``timeout`` covers all
        attempts; ``on_restart(result, attempt)`` is told of each restart.
        """

        def attempt(k: int, seconds_left: float) -> RunResult:
            extra = dict(env or {}, TORCHELASTIC_RESTART_COUNT=str(k), TORCHELASTIC_MAX_RESTARTS=str(max_restarts))
            return self._run_once(argv, seconds_left, extra, ranks, capture, k)

        return run_with_restarts(attempt, timeout, max_restarts, on_restart)

    def _run_once(self, argv: Sequence[str], timeout: float, env: dict[str, str], ranks: Sequence[int] | None,
                  capture: bool, attempt: int) -> RunResult:
        if not self._open:
            raise EmulatorError("the cluster is not started: use `with EmulatedCluster(...) as cluster:`")
        world = self.spec.job(ranks)
        master_env = self.rank_env(world[0], world, env)  # one port for the whole job
        # NOTE: a port per attempt: the store of a killed attempt may still hold the old one
        port = str(int(master_env["MASTER_PORT"]) + (attempt if not self.spec.simulate else 0))
        procs = []
        for k in world:
            e = self.rank_env(k, world, env)
            e["MASTER_PORT"] = port
            procs.append(RankProcess(k, self._argv(k, list(argv)), e, self._preexec(k),
                                     throttle=self.spec.compute[k] if self.spec.simulate else 1.0))
        return supervise(procs, timeout, capture)

    def exec(self, rank: int, argv: Sequence[str], timeout: float = 60.0, quota: bool = True
             ) -> subprocess.CompletedProcess:
        """Run one command in rank's namespace (and, with ``quota``, its cgroup and core)."""
        try:
            return subprocess.run(self._argv(rank, list(argv)), check=False, capture_output=True, text=True,
                                  timeout=timeout, preexec_fn=self._preexec(rank) if quota else None)
        except subprocess.TimeoutExpired as e:
            raise EmulatorError(f"`{' '.join(argv)}` on rank {rank} did not finish within {timeout:.0f} s") from e

    def _argv(self, rank: int, argv: list[str]) -> list[str]:
        if self.spec.simulate:
            return argv
        if shutil.which("nsenter") is None:  # util-linux missing: the rank gets its limit from the env
            return ["ip", "netns", "exec", self.nets[rank].netns, *argv]
        # NOTE: only the network namespace. `ip netns exec` also mounts a fresh /sys, which hides
        # /sys/fs/cgroup: the rank could not read its memory cgroup's usage and peak, in which the
        # kernel charges it and kills it (balance/memory.py measures the probe there)
        return ["nsenter", f"--net={netns.NETNS_DIR}/{self.nets[rank].netns}", "--", *argv]

    def _preexec(self, rank: int):
        cgroup = None if self.spec.simulate else self.cgroups[rank]
        memory = None if self.spec.simulate else self.memory_cgroups[rank]
        core = self.cores[rank]

        def enter() -> None:  # runs in the child between fork and exec
            if cgroup is not None:
                cgroup.add_self()
            if memory is not None:
                memory.add_self()
            os.sched_setaffinity(0, {core})
        return enter

    # ---- links -------------------------------------------------------------------------
    def measure_links(self) -> list[float | None]:
        """Each rank's upload throughput (Mbit/s) to a sink on the bridge, one rank at a time."""
        firsts = self.spec.node_firsts  # a node's ranks share its link: probe it once
        measured = measure_uploads(netns.bridge_ns(self.tag), netns.SINK_ADDR,
                                   {k: self.spec.rates_bps[k] for k in firsts},
                                   lambda k, argv: self.exec(k, argv, quota=False))
        return [measured[firsts[self.spec.node_of[k]]] for k in range(self.spec.nproc)]

    def describe(self) -> list[dict]:
        """One row per rank: what the cluster is (for tables and JSON)."""
        return [{
            "rank": k, "node": self.spec.node_of[k], "mode": self.mode, "compute_factor": self.spec.compute[k],
            "core": self.cores[k],
            "link": self.spec.links[k] if not self.spec.simulate else "unshaped (simulated)",
            "tier": self.spec.tier(k), "address": "127.0.0.1" if self.spec.simulate else self.nets[k].addr,
            "netns": None if self.spec.simulate else self.nets[k].netns,
            "measured_mbit_s": self.measured_mbit[k], "mtu": None if self.spec.simulate else self.spec.mtu,
            "memory_limit_bytes": self.spec.memory_bytes[k],
        } for k in range(self.spec.nproc)]


