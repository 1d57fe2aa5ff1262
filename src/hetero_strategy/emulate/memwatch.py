"""The peak of a memory cgroup's working set while a job runs: the memory its processes cannot give back.

The kernel's own high-water mark (v1 ``memory.max_usage_in_bytes``, v2 ``memory.peak``) also counts
the page cache charged to the group. Under a limit that cache grows until the limit and the kernel
reclaims it there, so the kernel's peak of a rank that runs fine equals its limit and says nothing
about the plan. The working set, usage less the inactive file cache (what the kernel reclaims first),
is the measure that container runtimes evict by (cAdvisor's ``container_memory_working_set_bytes``).
It has no kernel high-water mark, so it is sampled; a spike shorter than the period can be missed.
"""

from __future__ import annotations

import threading
from pathlib import Path
from types import TracebackType

from typing_extensions import Self

__all__ = ["WorkingSetPeak", "working_set_bytes"]


def working_set_bytes(group: Path, version: int) -> int:
    """Usage less inactive file cache, in bytes, of the cgroup at ``group`` (v1 or v2), now."""
    usage = (group / ("memory.usage_in_bytes" if version == 1 else "memory.current")).read_text()
    stat = dict(line.split()[:2] for line in (group / "memory.stat").read_text().splitlines()
                if len(line.split()) >= 2)
    # v1 names the group's own and its descendants' figures total_*; v2 counts descendants in every field
    inactive = stat.get("total_inactive_file" if version == 1 else "inactive_file", "0")
    return max(int(usage) - int(inactive), 0)


class WorkingSetPeak:
    """Samples ``working_set_bytes`` every ``period_s`` on a daemon thread while the block runs.

    ``peak`` is the largest sample (0 before any). Reading errors (the group removed under it) end
    the sampling quietly: the figure is a measurement aid, never a reason for a run to fail.
    """

    def __init__(self, group: Path, version: int, period_s: float = 0.01) -> None:
        self.group, self.version, self.period_s = Path(group), version, period_s
        self.peak = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _sample(self) -> None:
        while not self._stop.is_set():
            try:
                self.peak = max(self.peak, working_set_bytes(self.group, self.version))
            except (OSError, ValueError):
                return
            self._stop.wait(self.period_s)

    def __enter__(self) -> Self:
        self._thread = threading.Thread(target=self._sample, name="working-set-peak", daemon=True)
        self._thread.start()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None,
                 tb: TracebackType | None) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5.0)
