"""Momentum correction and momentum-factor masking for the Top-K exchange (DGC, Lin et al., ICLR 2018).

Sparse SGD with the optimizer's momentum applies momentum to the *sent* gradient only: an entry
held back in the residual for many steps loses the momentum it would have had, and when it is
finally sent it is amplified by a stale velocity. DGC moves the momentum into the hook instead,
per rank and before the selection, so the residual accumulates velocity:

1. u_t = m * u_{t-1} + g_t           (this rank's velocity, g_t its weighted gradient)
2. acc_t = u_t + gamma * v_{t-1}     (v: the error-feedback residual, which now holds velocity)
3. send the Top-K of acc_t; v_t = acc_t minus what was sent
4. masking: u_t = 0 where this step sent a sparse entry, so a stale velocity does not push an
   entry again right after it went out (DGC's momentum-factor masking).

Entries sent densely (warm-up, a periodic dense sync, a parameter that went dense) keep their
velocity: there nothing is held back, and summed over the ranks the velocities are exactly the
momentum of the summed gradient (DGC does the same for the tensors it does not compress).

The optimizer then must run **without** momentum (``SGD(momentum=0)``): the reduced gradient is
already a velocity. Velocities are kept like residuals, per parameter ordinal in a second
:class:`~hetero_strategy.hooks.memory.ResidualMemory`, so they survive DDP's bucket rebuild and
checkpoints; a non-finite step leaves them as they were, as it leaves the residuals.

Example::

    velocity = MomentumCorrection(momentum=0.9, masking=True)
    state = TopKState(momentum=velocity)          # or CompressedState(momentum_correction=0.9)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)   # momentum=0: the hook applies it
"""

from __future__ import annotations

from typing import Any

import torch

from hetero_strategy.hooks.memory import ResidualMemory

__all__ = ["MomentumCorrection", "optimizer_momentum_warning"]


class MomentumCorrection:
    """Per-rank velocities u of the Top-K exchange (see the module docstring).

    Args:
        momentum: the momentum factor m, in (0, 1) (``momentum_correction``).
        masking: zero u at the entries a sparse selection sent (``momentum_masking``).
    """

    __slots__ = ["masking", "memory", "momentum"]

    def __init__(self, momentum: float, masking: bool = True) -> None:
        self.momentum, self.masking = float(momentum), masking
        self.memory = ResidualMemory()  # velocities, keyed by the residuals' parameter ordinals

    @classmethod
    def of(cls, momentum: float, masking: bool = True) -> MomentumCorrection | None:
        """The correction for ``momentum_correction`` = momentum; None when it is 0 (off)."""
        return cls(momentum, masking) if momentum else None

    def advance(self, index: int, keys: tuple[int, ...], flat: torch.Tensor,
                sizes: list[int]) -> tuple[torch.Tensor, torch.Tensor]:
        """(u_{t-1}, u_t = m * u_{t-1} + flat) of one bucket, both (n,) fp32; u_{t-1} is the stored
        velocity, left unchanged until :func:`~hetero_strategy.hooks.topk_ef.store_residuals`."""
        old = self.memory.residual(index, keys, list(flat.split(sizes)))  # (n,) fp32
        return old, torch.add(flat, old, alpha=self.momentum).float()

    def dense_(self, index: int, keys: tuple[int, ...], flat: torch.Tensor, sizes: list[int]) -> None:
        """A dense exchange of the bucket (warm-up, a dense tier, a bucket sent whole): ``flat``
        becomes u_t in place (its dtype), stored unless it holds a NaN/inf; no masking."""
        old, new = self.advance(index, keys, flat, sizes)
        torch.where(torch.isfinite(new).all(), new, old, out=old)  # a dropped step keeps its velocity
        flat.copy_(new)

    def mask_(self, new: torch.Tensor, left: torch.Tensor, sizes: list[int], sparse: list[bool],
              ks: list[int]) -> None:
        """Momentum-factor masking: u_t = 0 where a sparse segment sent its entry.

        ``left`` is the accumulator once its sent entries were zeroed (the new residual).
        NOTE: an entry of ``left`` that is 0 was sent, or held acc = u + gamma * v = 0 exactly;
        zeroing u there too is the one (measure-zero) departure from DGC, and it spares a mask of
        the sent indices, whose payload padding points at real entries.
        """
        if not self.masking:
            return
        offset = 0
        for n, is_sparse, k in zip(sizes, sparse, ks):
            if is_sparse and k > 0:
                seg = new[offset:offset + n]
                seg.masked_fill_(left[offset:offset + n] == 0, 0.0)
            offset += n

    def state_dict(self) -> dict:
        return {"velocities": self.memory.state_dict()["residuals"]}

    def load_state_dict(self, state: dict) -> None:
        self.memory.load_state_dict({"residuals": state.get("velocities", {})})


def optimizer_momentum_warning(momentum_correction: float, optimizers: Any) -> str | None:
    """The warning to give when the hook applies momentum and an optimizer applies its own too
    (momentum twice, or Adam's moments of a velocity); None when nothing is wrong."""
    if not momentum_correction:
        return None
    for opt in optimizers if isinstance(optimizers, (list, tuple)) else [optimizers]:
        if any(g.get("momentum", 0) or "betas" in g for g in getattr(opt, "param_groups", [])):
            return (f"compression momentum_correction={momentum_correction} applies momentum in the comm hook, "
                    f"but the {type(opt).__name__} optimizer has its own: use SGD(momentum=0), or set "
                    "momentum_correction=0 (docs/compression.md, Momentum correction)")
    return None
