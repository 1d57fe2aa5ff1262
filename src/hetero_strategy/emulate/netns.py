"""Network namespaces for an emulated cluster: one per rank, joined by a bridge in its own namespace.

Layout for cluster tag ``T`` (every name starts with ``hsem-``, so leftovers are easy to find)::

    netns hsem-T-br : bridge br0 (10.77.0.254/24) + one port v<k> per rank, shaped (rank's download)
    netns hsem-T-r<k>: veth0 (10.77.0.<k+1>/24), shaped (rank's upload), lo

Nothing is created in the root namespace and no route leads out of the bridge namespace, so the
emulated cluster cannot reach (or disturb) any real network. Deleting the namespaces deletes the
veths and the bridge with them.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

from hetero_strategy.emulate.system import kill_pids, sh

__all__ = [
    "NETNS_DIR",
    "PREFIX",
    "RANK_IFNAME",
    "SINK_ADDR",
    "RankNet",
    "build_network",
    "emulator_namespaces",
    "owner_pid",
    "remove_namespace",
    "remove_network",
    "tbf_args",
]

PREFIX = "hsem-"
NETNS_DIR = "/var/run/netns"  # where `ip netns add` binds a namespace (iproute2's NETNS_RUN_DIR)
RANK_IFNAME = "veth0"
SINK_ADDR = "10.77.0.254"
_SUBNET = "10.77.0"


@dataclass(frozen=True)
class RankNet:
    rank: int
    netns: str
    ifname: str
    addr: str
    rate_bps: float | None


def tbf_args(rate_bps: float, latency_ms: float) -> list[str]:
    """tc arguments of a token bucket at ``rate_bps``: burst >= one 4 ms kernel tick of data."""
    burst = max(int(rate_bps / 8 / 250), 32 * 1024)  # bytes; rate/HZ at HZ=250, never below 32 KiB
    return ["tbf", "rate", f"{int(rate_bps)}bit", "burst", str(burst), "latency", f"{latency_ms:g}ms"]


def bridge_ns(tag: str) -> str:
    return f"{PREFIX}{tag}-br"


def rank_ns(tag: str, rank: int) -> str:
    return f"{PREFIX}{tag}-r{rank}"


def build_network(tag: str, rates_bps: list[float | None], latency_ms: list[float], mtu: int = 1500) -> list[RankNet]:
    """Create the bridge namespace and one shaped namespace per rank, every veth at ``mtu`` bytes;
    returns each rank's address."""
    if len(rates_bps) > 250:
        raise ValueError(f"nproc={len(rates_bps)} is invalid: the emulator's /24 subnet holds at most 250 ranks")
    br = bridge_ns(tag)
    sh("ip", "netns", "add", br)
    sh("ip", "-n", br, "link", "set", "lo", "up")
    sh("ip", "-n", br, "link", "add", "br0", "type", "bridge")
    sh("ip", "-n", br, "addr", "add", f"{SINK_ADDR}/24", "dev", "br0")
    sh("ip", "-n", br, "link", "set", "br0", "up")
    nets = []
    for k, rate in enumerate(rates_bps):
        ns, port, addr = rank_ns(tag, k), f"v{k}", f"{_SUBNET}.{k + 1}"
        sh("ip", "netns", "add", ns)
        sh("ip", "-n", ns, "link", "set", "lo", "up")
        # The veth is born inside the bridge namespace with its peer inside the rank's namespace.
        sh("ip", "-n", br, "link", "add", port, "type", "veth", "peer", "name", RANK_IFNAME, "netns", ns)
        sh("ip", "-n", br, "link", "set", port, "mtu", str(mtu), "master", "br0")
        sh("ip", "-n", br, "link", "set", port, "up")
        sh("ip", "-n", ns, "addr", "add", f"{addr}/24", "dev", RANK_IFNAME)
        sh("ip", "-n", ns, "link", "set", RANK_IFNAME, "mtu", str(mtu), "up")
        if rate is not None:
            shape(tag, k, rate, latency_ms[k])
        nets.append(RankNet(k, ns, RANK_IFNAME, addr, rate))
    return nets


def shape(tag: str, k: int, rate_bps: float, latency_ms: float) -> None:
    """Set namespace ``k``'s link to ``rate_bps`` in both directions (also while ranks run)."""
    # NOTE: netem is not available on these kernels; tbf shapes the rate. Egress of the rank's
    # end is its upload, egress of the bridge port its download: both directions are shaped.
    args = tbf_args(rate_bps, latency_ms)
    sh("tc", "-n", rank_ns(tag, k), "qdisc", "replace", "dev", RANK_IFNAME, "root", *args)
    sh("tc", "-n", bridge_ns(tag), "qdisc", "replace", "dev", f"v{k}", "root", *args)


def emulator_namespaces() -> list[str]:
    """Names of all namespaces this emulator may have created (any owner)."""
    out = sh("ip", "netns", "list", check=False).stdout
    return [line.split()[0] for line in out.splitlines() if line.startswith(PREFIX)]


def owner_pid(name: str) -> int | None:
    """The pid of the emulate process that created ``name`` (``hsem-<pid>-<n>-...``), if parseable."""
    parts = name[len(PREFIX):].split("-")
    return int(parts[0]) if parts and parts[0].isdigit() else None


def remove_namespace(name: str) -> None:
    """Kill processes left inside ``name`` and delete it (its veths and bridge go with it)."""
    pids = [int(p) for p in sh("ip", "netns", "pids", name, check=False).stdout.split() if p.isdigit()]
    kill_pids([p for p in pids if p != os.getpid()], signal.SIGKILL)
    sh("ip", "netns", "delete", name, check=False)


def remove_network(tag: str, namespaces: list[str]) -> None:
    """Delete cluster ``tag``'s ``namespaces``, its bridge, and any other namespace carrying its tag
    (a partially built cluster)."""
    for name in list(dict.fromkeys(namespaces)) + [bridge_ns(tag)]:
        remove_namespace(name)
    for name in emulator_namespaces():
        if name.startswith(f"{PREFIX}{tag}-"):
            remove_namespace(name)
