"""Backend dispatcher used by the compression hooks: Triton on CUDA, torch reference elsewhere.

Choice per call, first match wins:

1. the ``backend=`` argument of the call, if ``"torch"`` or ``"triton"``;
2. :func:`set_backend` (a config can force a backend process-wide; ``None`` clears it);
3. the environment variable ``HETERO_KERNELS`` (``auto|torch|triton``), read once, at the first
   call (:func:`reload_env` reads it again);
4. ``"auto"``: Triton for CUDA tensors when Triton imports, the torch reference otherwise.

An ``"auto"`` (or ``None``) at any level means "no preference here" and defers to the next one,
so hooks that pass their config's default ``backend="auto"`` still honour ``HETERO_KERNELS``.

Forcing ``"triton"`` on a CPU tensor is allowed only under ``TRITON_INTERPRET=1`` (that is how
the tests run the kernels on CPU); otherwise it raises, as it does when Triton is missing.
Nothing here imports Triton until a kernel is first needed, so ``import hetero_strategy``
works without Triton and without a GPU.

NaN/inf policy (both backends): ``|NaN|`` ranks above ``+inf``, which ranks above every finite
value, so non-finite entries are always selected first and *sent*: they surface in the reduced
gradient, where a GradScaler-style found-inf check sees them, instead of hiding in the residual.

Example::

    >>> import torch
    >>> from hetero_strategy.triton_kernels import dispatch
    >>> acc = dispatch.ef_accumulate(torch.tensor([1.0, -5.0, 2.0]), None, 0.9)
    >>> values, indices, count, residual = dispatch.topk_select(acc, k=1, capacity=2)
    >>> dispatch.backend_for(acc), indices.tolist(), count.item(), residual.tolist()
    ('torch', [1, 0], 1, [1.0, 0.0, 2.0])
    >>> dispatch.scatter_add(torch.zeros(3), values[None], indices[None]).tolist()
    [0.0, -5.0, 0.0]
"""

from __future__ import annotations

import os
from functools import lru_cache

from torch import Tensor

__all__ = [
    "BACKENDS",
    "backend_for",
    "ef_accumulate",
    "get_backend",
    "reload_env",
    "scatter_add",
    "segment_thresholds",
    "set_backend",
    "threshold_select_segments",
    "topk_select",
    "topk_select_segments",
]

BACKENDS = ("auto", "torch", "triton")
ENV_VAR = "HETERO_KERNELS"
_override: str | None = None


def _validate(name: str, source: str) -> str:
    choice = name.strip().lower()
    if choice not in BACKENDS:
        raise ValueError(f"{source}: {name!r} is not a kernel backend; use one of {', '.join(BACKENDS)}")
    return choice


def set_backend(name: str | None) -> None:
    """Force ``"torch"``/``"triton"`` (or ``"auto"``) for every later call; ``None`` restores the default."""
    global _override
    _override = None if name is None else _validate(name, "set_backend(name)")


@lru_cache(maxsize=1)
def _env_choice() -> str:
    # NOTE: cached: the hooks ask for every bucket of every step, and the environment of a
    # running job does not change
    return _validate(os.environ.get(ENV_VAR, "auto") or "auto", ENV_VAR)


def reload_env() -> None:
    """Read ``HETERO_KERNELS`` again at the next call (it is read once otherwise)."""
    _env_choice.cache_clear()


def get_backend() -> str:
    """The process-wide choice before per-tensor resolution: set_backend, else HETERO_KERNELS, else auto."""
    if _override is not None and _override != "auto":
        return _override
    return _env_choice()


@lru_cache(maxsize=1)
def triton_available() -> bool:
    """True when Triton imports (checked once, lazily)."""
    try:
        import triton  # noqa: F401
    except Exception:  # noqa: BLE001 - NOTE: a broken Triton install must not break the torch path
        return False
    return True


def _interpreter_on() -> bool:
    return os.environ.get("TRITON_INTERPRET", "0").strip().lower() not in ("", "0", "false", "no", "off")


def backend_for(t: Tensor, backend: str | None = None) -> str:
    """``"triton"`` or ``"torch"`` for tensor ``t``, following the rules in the module docstring."""
    choice = _validate(backend, "backend") if backend is not None else "auto"
    if choice == "auto":
        choice = get_backend()
    if choice == "torch":
        return "torch"
    if choice == "auto":
        return "triton" if t.is_cuda and triton_available() else "torch"
    if not triton_available():
        raise RuntimeError(f"{ENV_VAR}/backend: 'triton' forced but Triton does not import; install it or use 'torch'")
    if not t.is_cuda and not _interpreter_on():
        raise RuntimeError(
            f"{ENV_VAR}/backend: 'triton' forced for a {t.device} tensor; Triton needs CUDA tensors, "
            "or TRITON_INTERPRET=1 to run on the CPU interpreter; use 'auto' or 'torch' otherwise"
        )
    return "triton"


def ef_accumulate(grad: Tensor, residual: Tensor | None, gamma: float, *, backend: str | None = None,
                  inplace: bool = False) -> Tensor:
    """(n,) fp32 ``gamma * residual + grad`` (``residual=None`` means zeros); see :mod:`.ef_accumulate`.

    ``inplace=True`` lets the torch path write into an fp32 ``grad`` (no new bucket-sized tensor;
    :func:`.ef_accumulate.ef_accumulate_torch_`, within one rounding of the reference); the result
    is then ``grad`` itself. Triton always writes a new tensor.
    """
    from . import ef_accumulate as op

    if backend_for(grad, backend) == "triton":
        return op.ef_accumulate(grad, residual, gamma)
    if inplace and residual is not None and grad.dtype == residual.dtype:
        return op.ef_accumulate_torch_(grad, residual, gamma)
    return op.ef_accumulate_torch(grad, residual, gamma)


def topk_select(
    acc: Tensor, k: int, capacity: int, *, backend: str | None = None
) -> tuple[Tensor, Tensor, Tensor, Tensor]:
    """Select the ``min(k, n)`` entries of largest ``|acc|`` and compact them.

    Returns ``(values, indices, count, new_residual)``: fp32 (capacity,), int32 (capacity,) in
    ascending index order with unused slots 0/0, a 0-d int32 count on ``acc.device``
    (``min(k, n, capacity)``; never read on the host here), and fp32 (n,) ``acc`` with the sent
    entries set to 0. Ties at the threshold go to the lower index, so both backends select
    exactly ``min(k, n)`` entries and return identical outputs. If ``capacity`` is smaller,
    the first ``capacity`` selected entries (index order) are sent and the rest stay in the
    residual. The torch path uses ``topk``/``nonzero`` (a host sync on CUDA); the Triton path
    has none.
    """
    from . import topk_select as op

    if backend_for(acc, backend) == "triton":
        return op.topk_select(acc, k, capacity)
    return op.topk_select_torch(acc, k, capacity)


def topk_select_segments(
    acc: Tensor, offsets: list[int], sizes: list[int], ks: list[int], caps: list[int], *, backend: str | None = None
) -> tuple[Tensor, Tensor]:
    """Top-k of every segment of a bucket; sent entries of ``acc`` set to 0 in place.

    Returns ``(values, indices)``: fp32 and int32 (sum caps,), segment after segment, each in
    ascending index order and padded with value 0 at the segment's first index; indices are
    relative to ``acc``. Same selection rule as :func:`topk_select`; the torch backend is the
    one-pass sampled path, not the per-segment reference; see :mod:`.segments`.
    """
    from . import segments as op

    if backend_for(acc, backend) == "triton":
        return op.topk_select_segments(acc, offsets, sizes, ks, caps)
    return op.topk_select_segments_sampled(acc, offsets, sizes, ks, caps)


def segment_thresholds(acc: Tensor, offsets: list[int], sizes: list[int], ks: list[int], *,
                       backend: str | None = None) -> Tensor:
    """(S,) int32 threshold keys: each segment's k-th largest finite ``|acc|`` key minus 1 (k = 0:
    INT32_MAX, nothing), for :func:`threshold_select_segments`; see :mod:`.threshold_select`."""
    from . import threshold_select as op

    if backend_for(acc, backend) == "triton":
        return op.segment_thresholds(acc, offsets, sizes, ks)
    return op.segment_thresholds_torch(acc, offsets, sizes, ks)


def threshold_select_segments(
    acc: Tensor, offsets: list[int], sizes: list[int], thresholds: Tensor, caps: list[int], *,
    backend: str | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """Per segment, the entries whose key exceeds its threshold, in ``caps[s]`` slots (NaN/inf first,
    then index order; the overflow stays in ``acc``); sent entries of ``acc`` set to 0 in place.

    Returns ``(values, indices, sent)``: fp32 and int32 (sum caps,) laid out as
    :func:`topk_select_segments`' (bucket-relative indices, padding value 0 at the segment's first
    index), and the (S,) int32 count each segment sent, on ``acc.device``: one streaming pass
    instead of a select, for thresholds reused across steps (:mod:`.threshold_select`).
    """
    from . import threshold_select as op

    if backend_for(acc, backend) == "triton":
        return op.threshold_select_segments(acc, offsets, sizes, thresholds, caps)
    return op.threshold_select_segments_torch(acc, offsets, sizes, thresholds, caps)


def scatter_add(
    out: Tensor, values: Tensor, indices: Tensor, weights: Tensor | None = None, *, backend: str | None = None
) -> Tensor:
    """In place ``out[indices[r]] += weights[r] * values[r]`` for each row r of (R, capacity) payloads.

    Zero-valued padding is harmless; rows are added in order, so the result is deterministic.
    """
    from . import scatter_add as op

    if backend_for(out, backend) == "triton":
        return op.scatter_add(out, values, indices, weights)
    return op.scatter_add_torch(out, values, indices, weights)
