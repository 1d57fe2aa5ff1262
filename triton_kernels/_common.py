"""Shared helpers for the kernels: guarded Triton import and precondition checks.

Importing this module never fails: without Triton, ``triton``/``tl`` are ``None`` and
``HAS_TRITON`` is ``False``, so the torch references stay usable.

Example::

    >>> from hetero_strategy.triton_kernels._common import HAS_TRITON
    >>> isinstance(HAS_TRITON, bool)
    True
"""

from __future__ import annotations

import os
import threading

import torch

try:  # NOTE: guarded so that `import hetero_strategy` works on machines without Triton.
    import triton
    import triton.language as tl
except ImportError:  # pragma: no cover - exercised only where Triton is absent
    triton = None
    tl = None

__all__ = ["HAS_TRITON", "check_flat", "check_launchable", "interpreter_on", "launch", "tl", "triton"]

HAS_TRITON = triton is not None
# int32 indices and int32 counts inside the kernels.
MAX_NUMEL = 2**31 - 1
# NOTE: the interpreter patches triton.language and keeps the grid index in module globals while
# a kernel runs, so two interpreted kernels in different threads (a DDP comm hook's future
# callback next to the autograd thread) corrupt each other. Compiled launches need no lock.
_INTERPRETER_LOCK = threading.Lock()


def interpreter_on() -> bool:
    """True when ``TRITON_INTERPRET`` asks Triton to run kernels on the CPU interpreter."""
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no", "off")


def check_flat(name: str, t: torch.Tensor, dtypes: tuple[torch.dtype, ...], ndim: int = 1) -> None:
    """Refuse anything but a contiguous tensor of ``ndim`` dims with one of ``dtypes``."""
    if not isinstance(t, torch.Tensor):
        raise TypeError(f"{name}: expected a torch.Tensor, got {type(t).__name__}; pass a tensor")
    if t.dim() != ndim:
        raise ValueError(f"{name}: expected {ndim}-D, got shape {tuple(t.shape)}; flatten/reshape it first")
    if t.dtype not in dtypes:
        allowed = ", ".join(str(d).replace("torch.", "") for d in dtypes)
        raise ValueError(f"{name}: dtype {t.dtype} not supported; use one of {allowed}")
    if not t.is_contiguous():
        raise ValueError(f"{name}: tensor is not contiguous; call .contiguous() first")
    if t.numel() > MAX_NUMEL:
        raise ValueError(f"{name}: {t.numel()} elements exceed the int32 index range; split the bucket")


def check_launchable(kernel, *tensors: torch.Tensor) -> None:
    """Refuse a launch that cannot run: no Triton, mixed devices, or CPU tensors outside the interpreter."""
    if not HAS_TRITON:
        raise RuntimeError("Triton is not installed; use the torch backend (HETERO_KERNELS=torch)")
    devices = {t.device for t in tensors}
    if len(devices) > 1:
        raise ValueError(f"tensors are on different devices {sorted(map(str, devices))}; move them to one")
    device = next(iter(devices))
    if device.type != "cuda":
        # NOTE: triton.jit picks interpreter vs compiler when the kernel is *decorated*, i.e. at
        # import of the op module, so the env var must be set before that import.
        from triton.runtime.interpreter import InterpretedFunction

        if not isinstance(kernel, InterpretedFunction):
            raise RuntimeError(
                f"Triton kernels need CUDA tensors, got {device}; to run them on the CPU set "
                "TRITON_INTERPRET=1 before importing hetero_strategy.triton_kernels, or use HETERO_KERNELS=torch"
            )


def launch(kernel, grid: tuple[int, ...], *args, **kwargs) -> None:
    """``kernel[grid](*args, **kwargs)``, serialised across threads when the kernel is interpreted."""
    if type(kernel).__name__ == "InterpretedFunction":
        with _INTERPRETER_LOCK:
            kernel[grid](*args, **kwargs)
    else:
        kernel[grid](*args, **kwargs)
