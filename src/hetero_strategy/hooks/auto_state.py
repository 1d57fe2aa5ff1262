"""The state and hook of ``compression="auto"``: the chosen codec's own, behind one holder.

:class:`AutoState` measures and decides when it is built (:mod:`.auto`, collective), builds the
chosen codec's state from a config derived from the user's, and registers nothing of its own:
:func:`auto_hook` hands each bucket to the chosen hook. Everything else the runtime reads
(``set_local_batch``, ``last_bytes_sent``, ``metrics`` ...) is the chosen state's.

The decision is in the checkpoint. A resume on the same cluster (world size and every rank's
tier) keeps the saved decision, rebuilding the chosen state if this run measured otherwise, and
then loads its state (residuals, PowerSGD's memories); on another cluster the new decision stands
and a saved state of another codec is dropped, with a warning.

Example::

    state = AutoState(cfg, None, model=ddp_model)       # collective
    ddp_model.register_comm_hook(state, auto_hook)
"""

# NOTE: no `from __future__ import annotations`: DDP checks the hook's real annotation objects.
import dataclasses
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import CompressionConfig
from hetero_strategy.hooks.auto import AutoDecision, buckets_of, choose, measure
from hetero_strategy.hooks.tiers import exchange_policies

__all__ = ["AutoState", "auto_hook", "derived_config"]

log = logging.getLogger(__name__)

Builder = Callable[[CompressionConfig], "tuple[Any, Callable]"]


def derived_config(cfg: CompressionConfig, decision: AutoDecision) -> CompressionConfig:
    """The user's compression config with the decided codec in place of ``auto``."""
    topk_only = {"pipeline_stages": "auto", "side_streams": False, "hierarchical": False}
    if decision.codec == "dense":
        return dataclasses.replace(cfg, method="none", **topk_only)
    if decision.codec in ("fp16", "bf16"):
        return dataclasses.replace(cfg, method=decision.codec, **topk_only)
    if decision.codec == "powersgd":
        return dataclasses.replace(cfg, method="powersgd", powersgd_rank=decision.rank, **topk_only)
    return dataclasses.replace(cfg, method=decision.codec, base_density=decision.density, min_density=None,
                               density_schedule="constant")


class AutoState:
    """Holds the decided codec's (state, hook); reads fall through to the chosen state.

    Args:
        config: the compression config (``method="auto"``).
        process_group: the group to reduce over (None: the default group).
        model: the DDP model (its parameter shapes and ``bucket_bytes_cap``) or a module.
        builder: ``derived config -> (state, hook)``, the factory's builder of that method.
        compute_s: the step's compute, when known (0: the decision compares communication only).
        announce: where rank 0 says the decision (default: this module's logger).
    """

    def __init__(self, config: CompressionConfig, process_group: "dist.ProcessGroup | None", *, model: Any,
                 builder: Builder, compute_s: float = 0.0, announce: "Callable[[str], None] | None" = None) -> None:
        if model is None:
            raise ValueError("compression='auto' measures the model's buckets: pass model= (the DDP model) to "
                             "build_comm_hook, or choose a codec")
        params = [p for p in model.parameters() if p.requires_grad]
        self._shapes = [tuple(p.shape) for p in params]
        cap = int(getattr(model, "bucket_bytes_cap", 25 << 20))
        self._buckets = buckets_of(self._shapes, cap)
        self._config, self._group, self._builder = config, process_group, builder
        self._announce = announce or log.info
        world = dist.get_world_size(process_group) if dist.is_initialized() else 1
        if world < 2:
            tiers = ["nvlink"]
            self.decision = AutoDecision("dense", None, None, "nvlink", tiers, world, 0.0)
        else:
            tiers, _ = exchange_policies(config, process_group, None)  # collective: every rank's tier
            meas = measure(process_group, self._shapes, config.compression_backend)
            self.decision = choose(meas, self._buckets, world, tiers, compute_s, config.hierarchical)
        self.inner, self.hook = builder(derived_config(config, self.decision))
        self._say()

    def __getattr__(self, name: str) -> Any:  # only for names AutoState itself lacks
        if name.startswith("_") or name in ("inner", "hook", "decision"):
            raise AttributeError(name)
        return getattr(self.inner, name)

    @property
    def auto_predicted_ms(self) -> float:
        """The decision's predicted communication per step (a metric for the framework's logger)."""
        return float(self.decision.predicted_ms)

    def _say(self) -> None:
        if not dist.is_initialized() or dist.get_rank() == 0:
            self._announce(self.decision.describe())
            rows = ", ".join(f"{k}: {v['objective_ms']:.2f}" for k, v in self.decision.table.items() if "objective_ms" in v)
            if rows:
                self._announce(f"compression=auto: step factor x predicted ms per candidate: {rows}")

    # ---- checkpoints ---------------------------------------------------------------------------
    def state_dict(self) -> dict:
        return {"auto": self.decision.as_dict(), "inner": self.inner.state_dict()}

    def load_state_dict(self, state: dict) -> None:
        saved = state.get("auto")
        if saved is None:  # a checkpoint of a fixed codec: only its own state, if it fits
            self.inner.load_state_dict(state)
            return
        old = AutoDecision.from_dict(saved)
        if old.signature != self.decision.signature:
            log.warning("compression=auto: the cluster changed since the checkpoint (%s ranks, tiers %s -> %s "
                        "ranks, tiers %s): this run's decision stands%s", old.world, ",".join(old.tiers),
                        self.decision.world, ",".join(self.decision.tiers),
                        "" if old.same_choice(self.decision) else "; the saved codec state is dropped")
            if old.same_choice(self.decision):
                self.inner.load_state_dict(state.get("inner", {}))
            return
        if not old.same_choice(self.decision):  # same cluster: keep the saved decision (collective)
            self.decision = old
            self.inner, self.hook = self._builder(derived_config(self._config, old))
            self._say()
        self.inner.load_state_dict(state.get("inner", {}))


def auto_hook(state: AutoState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP comm hook of ``compression="auto"``: the chosen codec's hook on the chosen state."""
    return state.hook(state.inner, bucket)
