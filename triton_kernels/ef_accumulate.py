"""Fused error-feedback accumulate: ``acc = gamma * residual + grad`` in fp32.

One read of the gradient (fp32, fp16 or bf16) and of the fp32 residual, one fp32 write; the
half-precision gradient is widened inside the kernel, so no fp32 copy of it is materialised.

Example::

    >>> import torch
    >>> from hetero_strategy.triton_kernels.ef_accumulate import ef_accumulate_torch
    >>> ef_accumulate_torch(torch.ones(3, dtype=torch.bfloat16), torch.full((3,), 2.0), 0.5)
    tensor([2., 2., 2.])
"""

from __future__ import annotations

import torch

from ._common import HAS_TRITON, check_flat, check_launchable, launch, tl, triton

__all__ = ["ef_accumulate", "ef_accumulate_torch", "ef_accumulate_torch_"]

GRAD_DTYPES = (torch.float32, torch.float16, torch.bfloat16)

if HAS_TRITON:

    @triton.jit
    def _ef_accumulate_kernel(
        # inputs
        grad_ptr,
        residual_ptr,
        # outputs
        acc_ptr,
        # constants
        gamma,
        n,
        HAS_RESIDUAL: tl.constexpr,
        BLOCK: tl.constexpr,
    ):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        acc = tl.load(grad_ptr + offs, mask=mask, other=0.0).to(tl.float32)
        if HAS_RESIDUAL:
            res = tl.load(residual_ptr + offs, mask=mask, other=0.0)
            # Same association as the reference: round(gamma*res) then add (no FMA, see launcher).
            acc = res * gamma + acc
        tl.store(acc_ptr + offs, acc, mask=mask)

else:  # pragma: no cover - only without Triton
    _ef_accumulate_kernel = None


def _check(grad: torch.Tensor, residual: torch.Tensor | None, gamma: float) -> None:
    check_flat("grad", grad, GRAD_DTYPES)
    if residual is not None:
        check_flat("residual", residual, (torch.float32,))
        if residual.numel() != grad.numel():
            raise ValueError(
                f"residual: {residual.numel()} elements but grad has {grad.numel()}; "
                "keep one residual per bucket, sized like the bucket"
            )
        if residual.device != grad.device:
            raise ValueError(f"residual: on {residual.device} but grad on {grad.device}; use one device")
    if not isinstance(gamma, (int, float)):
        raise TypeError(f"gamma: expected a Python float, got {type(gamma).__name__}; pass float(gamma)")


def ef_accumulate_torch(grad: torch.Tensor, residual: torch.Tensor | None, gamma: float) -> torch.Tensor:
    """Reference: ``gamma * residual + grad.float()`` (``residual=None`` means zeros).

    Args:
        grad: (n,) fp32/fp16/bf16 gradient bucket.
        residual: (n,) fp32 error-feedback memory, or ``None`` on the first step.
        gamma: compensation strength (a tier's gamma, docs/design.md semantics 8: 1.0 by default, 0.9-0.98 in the older tier rows).

    Returns:
        (n,) fp32 accumulator, a new tensor. NaN/inf propagate unchanged (IEEE arithmetic).
    """
    _check(grad, residual, gamma)
    acc = grad.float()  # (n,) fp32
    if residual is None:
        return acc.clone() if acc is grad else acc
    return residual * float(gamma) + acc


def ef_accumulate_torch_(grad: torch.Tensor, residual: torch.Tensor, gamma: float) -> torch.Tensor:
    """In place: ``grad += gamma * residual`` for an fp32 ``grad``; returns ``grad``.

    The hooks' CPU path: it allocates no bucket-sized tensor. NOTE: ``torch.add``'s ``alpha`` runs
    as one fused multiply-add on CPU, so the result is within one fp32 rounding of
    :func:`ef_accumulate_torch` (which rounds ``gamma * residual`` first), not bitwise equal to it
    unless ``gamma`` is a power of two.
    """
    _check(grad, residual, gamma)
    if grad.dtype != torch.float32 or residual is None:
        raise ValueError(f"grad: {grad.dtype} with residual {residual is not None}; the in-place form needs an "
                         "fp32 grad and a residual, use ef_accumulate_torch otherwise")
    return grad.add_(residual, alpha=float(gamma))


def ef_accumulate(
    grad: torch.Tensor, residual: torch.Tensor | None, gamma: float, *, block: int = 1024
) -> torch.Tensor:
    """Triton launcher with the semantics of :func:`ef_accumulate_torch` (bitwise equal results).

    ``block`` is the number of elements per program (a power of two); tests use small blocks so
    the CPU interpreter stays fast.
    """
    _check(grad, residual, gamma)
    if block <= 0 or block & (block - 1):
        raise ValueError(f"block: {block} is not a positive power of two; use e.g. 1024")
    check_launchable(_ef_accumulate_kernel, grad, *([] if residual is None else [residual]))
    n = grad.numel()
    acc = torch.empty(n, dtype=torch.float32, device=grad.device)  # (n,) fp32
    if n == 0:
        return acc
    grid = (triton.cdiv(n, block),)
    launch(
        _ef_accumulate_kernel,
        grid,
        grad,
        residual if residual is not None else acc,  # dummy pointer, never read
        acc,
        float(gamma),
        n,
        HAS_RESIDUAL=residual is not None,
        BLOCK=block,
        # NOTE: no multiply-add contraction, so the result is bitwise that of the reference.
        enable_fp_fusion=False,
    )
    return acc
