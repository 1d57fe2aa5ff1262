"""The tensors hybrid training averages, and their anchor: their value at the last sync.

Parameters and floating buffers (BatchNorm's statistics) are averaged, by name; integer buffers
(``num_batches_tracked``) stay per rank. Each sync takes every rank's delta from the anchor,
adds the exchanged sum of the weighted deltas to it, and every rank continues from the anchor.
A checkpoint taken mid-period holds the anchor (the model written once for all ranks) and this
rank's own tensors, put back at the next local step.

Example::

    model = ModelAnchor(module)
    model.begin()                       # before a local step: the anchor is the model now
    ...                                 # local steps move the module's tensors
    model.advance(exchange(w * model.delta()))   # anchor += sum; every tensor := anchor
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["ModelAnchor"]


class ModelAnchor:
    """The averaged tensors of ``module`` by name, the anchor, and a checkpoint's local tensors."""

    def __init__(self, module: torch.nn.Module) -> None:
        self.tensors = {**dict(module.named_parameters()),
                        **{n: b for n, b in module.named_buffers() if b.is_floating_point()}}
        self.anchor: dict[str, torch.Tensor] | None = None  # fp32 copies at the last sync
        self._restored: dict[str, torch.Tensor] | None = None  # this rank's local tensors from a checkpoint

    @property
    def numel(self) -> int:
        return sum(t.numel() for t in self.tensors.values())

    @property
    def device(self) -> torch.device:
        return next(iter(self.tensors.values())).device

    @torch.no_grad()
    def begin(self) -> None:
        """Before a local step's forward: the period's anchor (and a checkpoint's local tensors)."""
        if self.anchor is None:
            self.anchor = {n: t.detach().float().clone() for n, t in self.tensors.items()}
        if self._restored is not None:
            for n, t in self.tensors.items():
                t.copy_(self._restored[n])
            self._restored = None

    def drop(self) -> None:
        """Leave the local phases: the next local step (if any) takes a new anchor."""
        self.anchor = None

    @torch.no_grad()
    def delta(self) -> torch.Tensor:
        """This rank's tensors minus the anchor, flat (numel,) fp32."""
        return torch.cat([(t.float() - self.anchor[n]).reshape(-1) for n, t in self.tensors.items()])

    @torch.no_grad()
    def advance(self, flat: torch.Tensor) -> None:
        """anchor += flat (numel,) fp32, then every averaged tensor := anchor."""
        offset = 0
        for n, t in self.tensors.items():
            a = self.anchor[n]
            a.add_(flat[offset:offset + a.numel()].view_as(a))
            t.copy_(a)
            offset += a.numel()

    def anchor_state(self, module_state: dict[str, Any], mid_period: bool) -> dict[str, Any]:
        """``module.state_dict()`` with the anchor in place of this rank's local tensors
        (``mid_period``: local steps ran since the last sync; otherwise they are the anchor)."""
        if self.anchor is None or not mid_period:
            return module_state
        return {k: self.anchor[k].to(v.dtype) if k in self.anchor else v for k, v in module_state.items()}

    def state_dict(self, mid_period: bool) -> dict[str, Any]:
        """Mid-period (or holding a checkpoint's local tensors not yet put back): the anchor and
        this rank's own tensors; at a sync boundary neither (every rank's model is the anchor)."""
        if not mid_period and self._restored is None:
            return {}
        local = self._restored or {n: t.detach().clone() for n, t in self.tensors.items()}
        return {"anchor": {n: a.clone() for n, a in self.anchor.items()},
                "local": {n: t.clone() for n, t in local.items()}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """The local tensors go into the model at the next local step (after whatever the framework
        loads into it, e.g. the anchor a checkpoint's model holds)."""
        self.anchor = {n: a.clone() for n, a in state["anchor"].items()} if "anchor" in state else None
        self._restored = {n: t.clone() for n, t in state["local"].items()} if "local" in state else None
