"""How much memory a rank's step takes: a fixed part and a part per sample, against the device's limit.

The start-up probe runs one step at each of two batch sizes under :class:`PeakMemory` and fits
``fixed + per_sample x b`` (:func:`fit_memory`). The fixed part holds what does not grow with the
batch: parameters and gradients (sharded or not, as the rank really holds them), optimizer state
that exists already, the framework's own memory; the per-sample part is the activations. (The
probe runs before the first optimizer step: state created there, such as Adam's moments, and
DDP's gradient buckets are not in it, see docs/fsdp.md.) With the device's limit
(:func:`memory_limit_bytes`) less a margin, :meth:`MemoryCost.cap` is the largest pass that fits.

* **CUDA**: ``torch.cuda.max_memory_allocated`` after a reset of the peak statistics, against the
  device's total memory. Exact for tensors; the caching allocator's fragmentation and the CUDA
  context (a few hundred MB) are outside it, which the margin covers.
* **CPU**, under a cgroup memory limit that the process can see: the kernel's own charge of the
  cgroup (its usage, and its peak reset at the step's start: v1 ``memory.max_usage_in_bytes``, v2
  ``memory.peak``), the accounting the kernel kills the process by. Else (no limit: no cap; a
  limit from ``$HETERO_MEMORY_LIMIT``, or a peak it may not reset) the kernel's high-water mark
  of the process's resident set (``VmHWM``, reset through ``/proc/self/clear_refs``; sampled
  every half millisecond where that is unavailable), which errs high: it counts the shared
  libraries' pages, which a cgroup charges only to whoever read them first. Both after freed heap memory went back to the
  system with ``malloc_trim``. glibc keeps freed memory and would blur the line, so the
  probe runs with every large allocation its own mapping (:func:`exact_host_memory`), and under
  a cgroup limit the process stays so, so that training uses what was measured. Approximate:
  the resident set also holds the interpreter and the libraries (all in the fixed part).
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from typing_extensions import Self

__all__ = ["MEMORY_LIMIT_ENV", "MemoryCost", "PeakMemory", "exact_host_memory", "fit_memory", "memory_limit_bytes"]

_CGROUP = Path("/sys/fs/cgroup")
MEMORY_LIMIT_ENV = "HETERO_MEMORY_LIMIT"
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


@dataclass(frozen=True)
class MemoryCost:
    """A rank's step memory as ``fixed_bytes + per_sample_bytes x b``, and its limit (None: unknown)."""

    fixed_bytes: float
    per_sample_bytes: float
    limit_bytes: float | None = None

    def bytes(self, batch: float) -> float:
        return self.fixed_bytes + self.per_sample_bytes * batch

    def cap(self, margin: float) -> int | None:
        """The largest pass (samples) within the limit less ``margin`` of it (0: not even one sample
        fits); None without a limit or growth."""
        if self.limit_bytes is None or self.per_sample_bytes <= 0:
            return None
        room = self.limit_bytes * (1 - margin) - self.fixed_bytes
        return max(0, int(room // self.per_sample_bytes))


def fit_memory(points: list[tuple[int, float]], limit_bytes: float | None) -> MemoryCost:
    """The line through (batch, peak bytes) at the smallest and largest batch; no growth if they coincide."""
    (b1, m1), (b2, m2) = min(points), max(points)
    per_sample = (m2 - m1) / (b2 - b1) if b2 > b1 and m2 > m1 else 0.0
    return MemoryCost(max(0.0, m2 - per_sample * b2), per_sample, limit_bytes)


def memory_limit_bytes(device: torch.device) -> float | None:
    """The memory a rank may use: the CUDA device's total, or this process's cgroup limit (None: none);
    ``$HETERO_MEMORY_LIMIT`` (bytes) first, for a process that cannot see its cgroup (a container
    without cgroupfs, a network namespace's fresh /sys, as the emulator's ranks run in)."""
    if os.environ.get(MEMORY_LIMIT_ENV, "").isdigit():
        return float(os.environ[MEMORY_LIMIT_ENV])
    if device.type == "cuda":
        return float(torch.cuda.get_device_properties(device).total_memory)
    group = _memory_cgroup()
    if group is None:
        return None
    value = _read(group[0] / ("memory.limit_in_bytes" if group[1] == 1 else "memory.max")).strip()
    return float(value) if value.isdigit() and int(value) < (1 << 60) else None  # v1: "none" is a huge number


def _memory_cgroup() -> tuple[Path, int] | None:
    """(directory, cgroup version) of this process's memory cgroup, where it is visible."""
    for line in _read("/proc/self/cgroup").splitlines():
        _, controllers, path = line.split(":", 2)
        if "memory" in controllers.split(","):  # v1: the memory controller's own hierarchy
            group = (_CGROUP / "memory" / path.lstrip("/"), 1)
        elif controllers == "":  # v2: one unified hierarchy
            group = (_CGROUP / path.lstrip("/"), 2)
        else:
            continue
        if group[0].is_dir():
            return group
    return None


class _CgroupPeak:
    """The kernel's charge of this process's memory cgroup: usage now and the peak since :meth:`open`
    reset it (v1 ``memory.max_usage_in_bytes``; v2 ``memory.peak`` through one file descriptor,
    Linux >= 6.12). ``open`` gives None where the peak cannot be reset (no write access, older v2)."""

    def __init__(self, start: float, read_peak: Any, close: Any) -> None:
        self.start, self.read_peak, self.close = start, read_peak, close

    @classmethod
    def open(cls) -> _CgroupPeak | None:
        group = _memory_cgroup()
        if group is None:
            return None
        path, version = group
        if len(_read(path / "cgroup.procs").split()) != 1:  # shared (a container's, a session's): others' memory too
            return None
        try:
            if version == 1:
                start = float(_read(path / "memory.usage_in_bytes"))
                (path / "memory.max_usage_in_bytes").write_text("0")  # the peak starts again from now
                return cls(start, lambda: float(_read(path / "memory.max_usage_in_bytes")), lambda: None)
            fd = os.open(path / "memory.peak", os.O_RDWR)
        except (OSError, ValueError):
            return None
        try:  # v2: a write resets the peak that this descriptor reads
            start = float(_read(path / "memory.current"))
            os.write(fd, b"reset\n")
        except (OSError, ValueError):
            os.close(fd)
            return None
        return cls(start, lambda: float(os.pread(fd, 64, 0)), lambda: os.close(fd))


class PeakMemory:
    """``with PeakMemory(device) as peak: step()``; then ``peak.bytes`` is the step's peak (see the module)."""

    def __init__(self, device: torch.device, interval_s: float = 0.0005) -> None:
        self.device, self.interval_s = device, interval_s
        self.bytes = 0.0  # the peak
        self.start = 0.0  # what was in use when the step began
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._hwm = False
        self._total = self._sampled = 0.0
        self._cgroup: _CgroupPeak | None = None

    def __enter__(self) -> Self:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            torch.cuda.reset_peak_memory_stats(self.device)
            self.start = float(torch.cuda.memory_allocated(self.device))
            return self
        _trim()
        # NOTE: only under a limit: without one the group may be shared (a container, a session), and
        # other processes' memory would blur this step's growth
        self._cgroup = _CgroupPeak.open() if memory_limit_bytes(self.device) is not None else None
        if self._cgroup is not None:  # the limit's own accounting: what the kernel kills at
            self.bytes = self.start = self._cgroup.start
            return self
        # NOTE: the whole resident set, shared libraries included: a memory cgroup charges this
        # process between its anonymous part and that (a library's pages go to whoever read them
        # first), so the caps err on the safe side
        self.bytes = self.start = self._total = _rss()
        self._hwm = _reset_high_water()
        if not self._hwm:  # no kernel high-water mark to read: sample
            self._thread = threading.Thread(target=self._sample, name="hetero-peak-memory", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.device.type == "cuda":
            torch.cuda.synchronize(self.device)
            self.bytes = float(torch.cuda.max_memory_allocated(self.device))
            return
        if self._cgroup is not None:
            try:
                self.bytes = max(self.start, self._cgroup.read_peak())
            finally:
                self._cgroup.close()
                self._cgroup = None
            return
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        top = max(_rss(), _high_water() if self._hwm else 0.0, self._sampled)
        self.bytes = self.start + max(0.0, top - self._total)

    def _sample(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._sampled = max(self._sampled, _rss())


def _rss() -> float:
    fields = _read("/proc/self/statm").split()
    return float(int(fields[1]) * _PAGE) if len(fields) > 1 else 0.0


def _reset_high_water() -> bool:
    try:
        Path("/proc/self/clear_refs").write_text("5")  # 5: the peak RSS becomes the current one
        return _high_water() > 0
    except OSError:
        return False


def _high_water() -> float:
    return _status_bytes("VmHWM:")


def _status_bytes(key: str) -> float:
    for line in _read("/proc/self/status").splitlines():
        if line.startswith(key):
            return float(line.split()[1]) * 1024
    return 0.0


_M_MMAP_THRESHOLD = -3  # glibc's mallopt parameter
_STEADY_MMAP_THRESHOLD = 32 << 20  # where glibc's own adaptive threshold ends up on 64-bit (its maximum)


@contextlib.contextmanager
def exact_host_memory(device: torch.device, keep: bool = False) -> Iterator[None]:
    """On CPU with glibc: inside, every allocation above 64 KiB is its own mapping, returned to the
    system when freed, so the resident set follows what is alive. After, the threshold goes to the
    value glibc's adaptive one reaches anyway (32 MiB), unless ``keep``: then the process goes on
    in this mode, so its memory stays what the probe measured (glibc otherwise keeps freed memory:
    about 1.5x the live bytes per sample on tests/test_memory_plan.py's model), at the cost of
    mapping large tensors afresh at each step."""
    libc = _libc() if device.type == "cpu" else None
    if libc is None:
        yield
        return
    libc.mallopt(_M_MMAP_THRESHOLD, 64 << 10)
    try:
        yield
    finally:
        if not keep:
            libc.mallopt(_M_MMAP_THRESHOLD, _STEADY_MMAP_THRESHOLD)


def _libc() -> Any:
    try:
        libc = ctypes.CDLL("libc.so.6")
        return libc if hasattr(libc, "mallopt") else None
    except OSError:
        return None


def _trim() -> None:
    # NOTE: glibc keeps freed heap memory mapped, so a larger earlier step would hide this one's growth
    try:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
    except (OSError, AttributeError):
        pass


def _read(path: Any) -> str:
    try:
        return Path(path).read_text()
    except OSError:
        return ""
