"""Error-feedback memory (GRACE's "Memory" role): residuals that survive DDP's bucket rebuild.

sent_t + residual_t = g_t + gamma * residual_{t-1}  (docs/design.md semantics 6).

DDP rebuilds its buckets after the first iteration (in gradient-ready order), so a residual keyed
by ``bucket.index()`` alone would be applied to the wrong parameters afterwards. Here each bucket
has one flat residual (fast, one tensor per bucket), but every parameter's slice of it is also
known by the parameter's *ordinal*: the order in which the hook first met the parameters. When a
bucket arrives with a new layout, its flat residual is rebuilt from the parameters' old slices.
That ordinal is deterministic for a given model and ``bucket_cap_mb`` (the first iteration always
runs DDP's initial layout, buckets in index order), so checkpoints store residuals per ordinal
and a resumed run puts them back whatever the current layout.

Example::

    mem = ResidualMemory()
    keys = mem.keys(bucket)                       # ordinals of the bucket's parameters
    residual = mem.residual(bucket.index(), keys, bucket.gradients())   # (numel,) fp32, zeros at first
    ...                                           # compress, then store what was not sent:
    residual.copy_(new_residual)
"""

from __future__ import annotations

import torch
import torch.distributed as dist

__all__ = ["ResidualMemory"]


class _Slot:
    __slots__ = ["flat", "keys"]

    def __init__(self, keys: tuple[int, ...], flat: torch.Tensor) -> None:
        self.keys = keys
        self.flat = flat  # (bucket numel,) fp32


class ResidualMemory:
    """Per-bucket flat residuals addressable per parameter (see the module docstring)."""

    __slots__ = ["_ordinal", "_pending", "_slots", "_views"]

    def __init__(self) -> None:
        self._ordinal: dict[int, int] = {}  # id(param) -> ordinal (first-seen order)
        self._slots: dict[int, _Slot] = {}  # bucket index -> slot
        self._views: dict[int, torch.Tensor] = {}  # ordinal -> flat view of its residual
        self._pending: dict[int, torch.Tensor] = {}  # ordinal -> residual loaded from a checkpoint

    def keys(self, bucket: dist.GradBucket) -> tuple[int, ...]:
        """Ordinals of the bucket's parameters, assigning new ones in first-seen order."""
        out = []
        for p in bucket.parameters():
            key = self._ordinal.get(id(p))
            if key is None:
                key = self._ordinal[id(p)] = len(self._ordinal)
            out.append(key)
        return tuple(out)

    def ordinal(self, param: torch.Tensor) -> int | None:
        """The key of ``param``'s residual in :meth:`state_dict` (None until the hook has seen it)."""
        return self._ordinal.get(id(param))

    def residual(self, index: int, keys: tuple[int, ...], grads: list[torch.Tensor]) -> torch.Tensor:
        """The bucket's flat fp32 residual; rebuilt from per-parameter slices if the layout changed."""
        slot = self._slots.get(index)
        if slot is not None and slot.keys == keys:
            return slot.flat
        numel = sum(g.numel() for g in grads)
        flat = torch.zeros(numel, dtype=torch.float32, device=grads[0].device)
        offset = 0
        for key, g in zip(keys, grads):
            view = flat[offset:offset + g.numel()]
            old = self._views.get(key)
            if old is None:
                old = self._pending.pop(key, None)
            if old is not None:
                if old.numel() != g.numel():
                    raise RuntimeError(f"residual of parameter #{key} has {old.numel()} entries but the "
                                       f"parameter has {g.numel()}: the checkpoint is of another model")
                view.copy_(old.reshape(-1))
            self._views[key] = view
            offset += g.numel()
        # NOTE: an old slot's storage stays alive through the views of parameters not yet moved,
        # so buckets may be re-laid out one at a time during the rebuilt iteration.
        self._slots[index] = _Slot(keys, flat)
        return flat

    def has(self, index: int) -> bool:
        return index in self._slots

    def state_dict(self) -> dict:
        """Residuals per parameter ordinal, as CPU copies (pending ones included)."""
        out = {k: v.detach().cpu().clone() for k, v in self._pending.items()}
        out.update({k: v.detach().cpu().clone() for k, v in self._views.items()})
        return {"residuals": out}

    def load_state_dict(self, state: dict) -> None:
        """Drop current residuals; the loaded ones attach lazily when their buckets next arrive."""
        self._slots.clear()
        self._views.clear()
        self._pending = {int(k): v.to(torch.float32) for k, v in state.get("residuals", {}).items()}

    def total_numel(self) -> int:
        return sum(s.flat.numel() for s in self._slots.values())
