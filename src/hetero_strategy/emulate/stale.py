"""What emulate processes that no longer exist left behind (e.g. SIGKILLed): found and removed.

Every namespace and cgroup the emulator creates is named ``hsem-<pid>-<n>-...`` after the process
that built it (:func:`~hetero_strategy.emulate.netns.owner_pid`), so one whose owner is gone is
stale. A cluster removes the stale ones before it builds its own (``EmulatedCluster.start``).
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

from hetero_strategy.emulate import netns
from hetero_strategy.emulate.system import EmulatorError, cgroup_cpu_root, remove_cgroup

__all__ = ["clean_stale", "leftovers"]


def clean_stale() -> list[str]:
    """Remove namespaces and cgroups left by emulate processes that no longer exist (e.g. SIGKILLed)."""
    removed = []
    for name in netns.emulator_namespaces():
        if not _alive(netns.owner_pid(name)):
            netns.remove_namespace(name)
            removed.append(f"netns {name}")
    for d in sorted(d for root in _cgroup_roots() for d in root.glob(f"{netns.PREFIX}*")):
        if d.is_dir() and not _alive(netns.owner_pid(d.name)):
            remove_cgroup(d)
            removed.append(f"cgroup {d}")
    return removed


def leftovers() -> list[str]:
    """Everything with the emulator's prefix that exists now (namespaces, interfaces, cgroups)."""
    found = [f"netns {n}" for n in netns.emulator_namespaces()]
    links = subprocess.run(["ip", "-o", "link"], check=False, capture_output=True, text=True, timeout=10).stdout
    found += [f"link {line.split(':')[1].strip()}" for line in links.splitlines() if netns.PREFIX in line]
    found += [f"cgroup {d}" for root in _cgroup_roots() for d in root.glob(f"{netns.PREFIX}*")]
    return found


def _cgroup_roots() -> list[Path]:
    """Where the emulator's cgroups live: the cpu hierarchy, and on cgroup v1 the memory one too."""
    try:
        roots = [cgroup_cpu_root()[0]]
    except EmulatorError:
        roots = []
    memory = Path("/sys/fs/cgroup/memory")
    return roots + [memory] if (memory / "memory.limit_in_bytes").exists() and memory not in roots else roots


def _alive(pid: int | None) -> bool:
    if pid is None:
        return False
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return Path(f"/proc/{pid}").exists()
