"""What this rank runs on: a CUDA device (torch.cuda + NVML when present) or the CPU.

NVML (``import pynvml`` from nvidia-ml-py) is optional: without it, or without a driver, the
NVLink/PCIe fields are None and everything else still works.

Example::

    >>> info = describe_device()
    >>> info["kind"] in ("cpu", "cuda")
    True
    >>> training_dtype(DeviceInfo("cuda", "Tesla V100-SXM2", (7, 0)))
    'fp16'
"""

from __future__ import annotations

import contextlib
import os
import platform
import socket
from dataclasses import dataclass
from typing import Any

import torch

__all__ = ["DeviceInfo", "describe_device", "training_dtype"]


@dataclass(frozen=True)
class DeviceInfo:
    """What the dtype rule and the precision policy look at: device type, name, and (CUDA) compute
    capability. :meth:`of` reads it from a live device; :meth:`from_facts` from
    :func:`describe_device`'s facts (a profile)."""

    type: str
    name: str
    capability: tuple[int, int] | None = None

    @classmethod
    def of(cls, device: torch.device) -> DeviceInfo:
        """The facts of a live device (CUDA: its name and capability; no NVML involved)."""
        if device.type == "cuda":
            index = device.index if device.index is not None else torch.cuda.current_device()
            return cls("cuda", torch.cuda.get_device_name(index), torch.cuda.get_device_capability(index))
        return cls(device.type, device.type)

    @classmethod
    def from_facts(cls, facts: dict[str, Any]) -> DeviceInfo:
        """From :func:`describe_device`'s dict (``kind``, ``name``, ``compute_capability`` "8.0")."""
        cc = facts.get("compute_capability")
        capability = tuple(int(x) for x in str(cc).split(".")[:2]) if cc else None
        return cls(str(facts.get("kind")), str(facts.get("name")), capability)  # type: ignore[arg-type]


def training_dtype(info: DeviceInfo) -> str:
    """The autocast dtype for a device (docs/design.md semantics 9): bf16 from compute capability
    8.0 (A100, 3090, H100), fp16 with loss scaling on 7.x (V100, T4), fp32 below that and off CUDA."""
    if info.type != "cuda" or info.capability is None:
        return "fp32"
    major = info.capability[0]
    return "bf16" if major >= 8 else "fp16" if major == 7 else "fp32"


def describe_device(local_rank: int | None = None) -> dict[str, Any]:
    """Name, kind, memory and link facts of the device this rank trains on."""
    base = {"host": socket.gethostname(), "pid": os.getpid()}
    if torch.cuda.is_available():
        idx = int(os.environ.get("LOCAL_RANK", "0")) if local_rank is None else local_rank
        idx %= torch.cuda.device_count()
        props = torch.cuda.get_device_properties(idx)
        base.update(kind="cuda", index=idx, name=props.name, compute_capability=f"{props.major}.{props.minor}",
                    memory_bytes=int(props.total_memory), multiprocessors=props.multi_processor_count)
        base.update(_nvml_facts(idx))
        return base
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else list(range(os.cpu_count() or 1))
    base.update(kind="cpu", index=None, name=_cpu_name(), compute_capability=None,
                memory_bytes=_mem_total(), cores=len(cpus), threads=torch.get_num_threads(),
                nvlink_links=None, pcie=None)
    return base


def _nvml_facts(index: int) -> dict[str, Any]:
    """NVLink links that are up and PCIe generation/width, from NVML; Nones when NVML is absent."""
    facts: dict[str, Any] = {"nvlink_links": None, "pcie": None}
    try:
        import pynvml
    except ImportError:
        return facts
    try:
        pynvml.nvmlInit()
    except Exception:  # noqa: BLE001 - NVMLError_* when no driver: the facts stay unknown
        return facts
    try:
        # NOTE: NVML numbers devices in PCI order while CUDA may not (CUDA_DEVICE_ORDER): match by bus id.
        bus = _pci_bus_id(index)
        handle = pynvml.nvmlDeviceGetHandleByPciBusId(bus) if bus else pynvml.nvmlDeviceGetHandleByIndex(index)
        up = 0
        for link in range(getattr(pynvml, "NVML_NVLINK_MAX_LINKS", 18)):
            try:
                up += int(pynvml.nvmlDeviceGetNvLinkState(handle, link) == pynvml.NVML_FEATURE_ENABLED)
            except Exception:  # noqa: BLE001 - NVMLError_NotSupported / InvalidArgument past the last link
                break
        facts["nvlink_links"] = up
        facts["pcie"] = {"gen": pynvml.nvmlDeviceGetCurrPcieLinkGeneration(handle),
                         "width": pynvml.nvmlDeviceGetCurrPcieLinkWidth(handle)}
    except Exception as e:  # noqa: BLE001 - partial NVML support (e.g. inside some containers)
        facts["nvml_error"] = str(e)
    finally:
        with contextlib.suppress(Exception):
            pynvml.nvmlShutdown()
    return facts


def _pci_bus_id(index: int) -> str | None:
    props = torch.cuda.get_device_properties(index)
    parts = [getattr(props, f"pci_{k}_id", None) for k in ("domain", "bus", "device")]
    if any(not isinstance(p, int) for p in parts):
        return None
    return f"{parts[0]:08X}:{parts[1]:02X}:{parts[2]:02X}.0"


def _cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "cpu"


def _mem_total() -> int | None:
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemTotal:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None
