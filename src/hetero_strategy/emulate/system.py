"""Thin, bounded wrappers around ``ip``, ``tc`` and the cgroup filesystem (root only).

Every call has a timeout; failures raise :class:`EmulatorError` with the command and its stderr.
cgroup v1 (``cpu.cfs_quota_us`` / ``cpu.cfs_period_us``, ``memory.limit_in_bytes``) and v2
(``cpu.max``, ``memory.max``) are both handled.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from pathlib import Path

from hetero_strategy.emulate.memwatch import WorkingSetPeak

__all__ = ["CpuCgroup", "EmulatorError", "MemoryCgroup", "cgroup_cpu_root", "is_root", "kill_pids", "sh"]

_CGROUP = Path("/sys/fs/cgroup")
# A short CFS period spreads a rank's quota finely (5.7 ms of every 10 ms at factor 0.57), which is
# how a slower device behaves; the kernel's default 100 ms would stop a rank for 43 ms at a time,
# also in the middle of a collective, and charge that stall to whoever waits for it.
_PERIOD_US = int(os.environ.get("HETERO_EMULATE_CPU_PERIOD_US", "10000"))


class EmulatorError(RuntimeError):
    """The emulator could not build or run the cluster; the message says what to do."""


def is_root() -> bool:
    return os.geteuid() == 0


def sh(*args: str, timeout: float = 10.0, check: bool = True) -> subprocess.CompletedProcess:
    """Run one system command, bounded in time; raise EmulatorError on failure when ``check``."""
    if shutil.which(args[0]) is None:
        raise EmulatorError(f"{args[0]!r} not found: install iproute2 (ip, tc) to build an emulated cluster")
    try:
        out = subprocess.run(args, check=False, capture_output=True, text=True, timeout=timeout)
    except subprocess.TimeoutExpired as e:
        raise EmulatorError(f"`{' '.join(args)}` did not finish within {timeout:.0f} s") from e
    if check and out.returncode != 0:
        raise EmulatorError(f"`{' '.join(args)}` failed ({out.returncode}): {out.stderr.strip()}")
    return out


def cgroup_cpu_root() -> tuple[Path, int]:
    """(directory under which per-rank cpu cgroups are made, cgroup version 1 or 2)."""
    if (_CGROUP / "cgroup.controllers").exists():  # pure v2 hierarchy mounted at /sys/fs/cgroup
        if "cpu" not in (_CGROUP / "cgroup.controllers").read_text().split():
            raise EmulatorError("cgroup v2 without the cpu controller: enable it to emulate compute speed")
        return _CGROUP, 2
    for name in ("cpu", "cpu,cpuacct"):
        if (_CGROUP / name / "cpu.cfs_quota_us").exists():
            return _CGROUP / name, 1
    raise EmulatorError(f"no cgroup cpu controller under {_CGROUP}: mount cgroup v1 'cpu' or v2 with 'cpu'")


class CpuCgroup:
    """One cgroup with a CPU quota of ``factor`` cores; ``remove`` kills what is left and deletes it."""

    def __init__(self, name: str, factor: float) -> None:
        root, self.version = cgroup_cpu_root()
        self.path = root / name
        self.factor = factor
        self.path.mkdir(exist_ok=True)
        # The kernel refuses quotas under 1 ms: lengthen the period for very small factors.
        period = max(_PERIOD_US, round(1000 / factor))
        quota = max(1000, round(factor * period))
        # NOTE: a high weight, so the rank owns its core: at the default weight every other process on
        # the box took an equal share of the fast rank's core while the quota capped only the slow
        # one, and at a load of 3.5 the demo's 1.0 / 0.57 ranks computed in 0.77 s vs 0.84 s.
        if self.version == 1:
            (self.path / "cpu.cfs_period_us").write_text(str(period))
            (self.path / "cpu.cfs_quota_us").write_text(str(quota))
            (self.path / "cpu.shares").write_text(str(64 * 1024))  # default 1024
        else:
            _enable_v2_cpu(root)
            (self.path / "cpu.max").write_text(f"{quota} {period}")
            (self.path / "cpu.weight").write_text(str(64 * 100))  # default 100

    def add_self(self) -> None:
        """Move the calling process into the cgroup (used in a child before exec)."""
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def pids(self) -> list[int]:
        return read_pids(self.path)

    def remove(self) -> None:
        remove_cgroup(self.path)


class MemoryCgroup:
    """One cgroup with a memory limit (``memory.max`` on v2, ``memory.limit_in_bytes`` on v1; None: no
    limit, only accounting): the kernel kills a process in it that goes over. ``peak_bytes`` is the
    kernel's own high-water mark of the group (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``)."""

    def __init__(self, name: str, limit_bytes: int | None = None) -> None:
        if (_CGROUP / "cgroup.controllers").exists():
            self.version, root = 2, _CGROUP
            control = root / "cgroup.subtree_control"
            if "memory" not in control.read_text().split():
                control.write_text("+memory")
        elif (_CGROUP / "memory" / "memory.limit_in_bytes").exists():
            self.version, root = 1, _CGROUP / "memory"
        else:
            raise EmulatorError(f"no cgroup memory controller under {_CGROUP}: mount cgroup v1 'memory' or v2")
        self.path = root / name
        self.path.mkdir(exist_ok=True)
        self.limit_bytes: int | None = None
        if limit_bytes is not None:
            self.set_limit(limit_bytes)
            if self.version == 2:
                (self.path / "memory.swap.max").write_text("0")

    def add_self(self) -> None:
        (self.path / "cgroup.procs").write_text(str(os.getpid()))

    def set_limit(self, limit_bytes: int | None) -> None:
        """A new limit for the next processes (None: none); the group should be empty."""
        self.limit_bytes = None if limit_bytes is None else int(limit_bytes)
        value = str(int(limit_bytes)) if limit_bytes is not None else ("-1" if self.version == 1 else "max")
        if self.version == 1:
            memsw = self.path / "memory.memsw.limit_in_bytes"  # must stay >= the limit at every moment
            if memsw.exists():
                memsw.write_text("-1")
            (self.path / "memory.limit_in_bytes").write_text(value)
            if memsw.exists():
                memsw.write_text(value)  # no escape into swap
        else:
            (self.path / "memory.max").write_text(value)

    def reset_peak(self) -> None:
        """Start the peak again from the current usage (v1; v2 from Linux 6.12); no-op where unsupported.

        NOTE: an empty v1 group first drops the page cache its last processes left charged to it
        (``memory.force_empty``): the next one would start with it in its usage, and its peak too."""
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        try:
            if self.version == 1 and not read_pids(self.path):
                (self.path / "memory.force_empty").write_text("0")
            (self.path / name).write_text("0")
        except OSError:
            pass

    def oom_kills(self) -> int:
        """How many processes of this group the kernel killed for going over its limit, so far."""
        name = "memory.oom_control" if self.version == 1 else "memory.events"
        try:
            text = (self.path / name).read_text()
        except OSError:
            return 0
        fields = dict(line.split()[:2] for line in text.splitlines() if len(line.split()) >= 2)
        return int(fields.get("oom_kill", "0"))

    def peak_bytes(self) -> int:
        name = "memory.max_usage_in_bytes" if self.version == 1 else "memory.peak"
        return int((self.path / name).read_text().strip())

    def watch_working_set(self, period_s: float = 0.01) -> WorkingSetPeak:
        """A context manager whose ``peak`` is this group's sampled working-set peak (see memwatch)."""
        return WorkingSetPeak(self.path, self.version, period_s)

    def oom_killed(self) -> bool:
        """Whether the kernel killed a process of this group for going over its limit."""
        return self.oom_kills() > 0

    def remove(self) -> None:
        remove_cgroup(self.path)


def _enable_v2_cpu(root: Path) -> None:
    control = root / "cgroup.subtree_control"
    if "cpu" not in control.read_text().split():
        control.write_text("+cpu")


def read_pids(path: Path) -> list[int]:
    try:
        return [int(x) for x in (path / "cgroup.procs").read_text().split()]
    except (FileNotFoundError, ProcessLookupError, ValueError):
        return []


def remove_cgroup(path: Path) -> None:
    """Kill the processes still in the cgroup, then rmdir it (bounded: 50 tries, ~5 s)."""
    for _ in range(50):
        if not path.exists():
            return
        kill_pids(read_pids(path), signal.SIGKILL)
        try:
            path.rmdir()
            return
        except OSError:  # EBUSY while killed tasks are still exiting
            time.sleep(0.1)
    raise EmulatorError(f"could not remove cgroup {path}: processes {read_pids(path)} remain")


def kill_pids(pids: list[int], sig: int) -> None:
    for pid in pids:
        if pid == os.getpid():
            continue
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
