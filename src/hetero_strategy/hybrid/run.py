"""``HybridTraining``: the phase schedule and the local-step controller behind the runtime's events.

An adapter (or a bare loop, through :class:`~hetero_strategy.runtime.HeteroRuntime`) calls it from
five framework events: batch start (:meth:`local_step`), before the optimizer step
(:meth:`before_optimizer_step`), after it (:meth:`step_end`), validation end (:meth:`evaluated`),
and state_dict / load_state_dict.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Callable
from typing import Any

from hetero_strategy.config import ConfigError, HybridConfig
from hetero_strategy.dist import all_gather_floats
from hetero_strategy.hybrid.local_sgd import LocalSGD
from hetero_strategy.hybrid.schedule import PhaseSchedule

__all__ = ["HybridTraining"]

Phase = Callable[[str], contextlib.AbstractContextManager]


class HybridTraining:
    """Which phase runs, its local steps and syncs, and their checkpointable state.

    The runtime holds one in ``mode="hybrid"`` (and a no-op stand-in with the same methods,
    :class:`~hetero_strategy.runtime.training_mode.SyncTraining`, in ``mode="sync"``).

    Args:
        config: the ``hybrid`` section (``mode="hybrid"``).
        rank: this process's global rank.
        world_size: the number of ranks.
        info: where phase switches are logged (rank 0 only).
        phase: a context for collectives (the runtime's stall watch).
    """

    def __init__(self, config: HybridConfig, rank: int, world_size: int, info: Callable[[str], None],
                 phase: Phase | None = None, stall_timeout_s: float = 60.0) -> None:
        self.config, self.rank, self.world_size = config, rank, world_size
        self.stall_timeout_s = stall_timeout_s
        self.schedule = PhaseSchedule(config, info)
        self.controller: LocalSGD | None = None
        self._phase = phase
        # NOTE: a list in call order, not a WeakSet: its order must be the same on every rank
        self._optimizers: list[weakref.ref] = []
        self._pending: dict[str, Any] | None = None
        self._joined = False  # joined with no local step since: a join now adds nothing
        self.synced = True  # every rank holds the same model and waits for no one: evaluate or save here
        # NOTE: synced points counted alike on every rank (not the syncs inside a join, which only the
        # active ranks see): what checkpoints are scheduled and named by
        self.points = 0

    #: local phases keep each rank's own optimizer state: checkpoints carry it per rank
    per_rank_optimizers = True

    @property
    def local(self) -> bool:
        """A local-SGD phase (models averaged every period), not the last, synchronous one."""
        return not self.schedule.synchronous

    def attach(self, ddp_model: Any) -> None:
        """Set up the controller on the DDP model (after its constructor broadcast the weights)."""
        module = getattr(ddp_model, "module", ddp_model)
        self.controller = LocalSGD(self.config, module, self.rank, self.world_size,
                                   group=getattr(ddp_model, "process_group", None), phase=self._phase,
                                   stall_timeout_s=self.stall_timeout_s)
        if self._pending is not None:
            self.controller.load_state_dict(self._pending)
            self._pending = None

    # ---- events --------------------------------------------------------------------------
    def local_step(self, ddp_model: Any) -> contextlib.AbstractContextManager:
        """``no_sync`` for a local step's forward and backward; nothing in the synchronous phase."""
        if not self.local:
            return contextlib.nullcontext()
        self._require_controller()
        self.controller.begin_step()
        no_sync = getattr(ddp_model, "no_sync", None)
        return no_sync() if no_sync is not None else contextlib.nullcontext()

    def before_optimizer_step(self, optimizer: Any) -> None:
        """Clip the local gradient (local phases); remembers the optimizer for the phase change."""
        if not any(ref() is optimizer for ref in self._optimizers):
            self._optimizers.append(weakref.ref(optimizer))
        if self.local:
            self._require_controller()
            self.controller.clip()

    def step_end(self, samples: float) -> bool:
        """The optimizer step ended; True when it ended at a sync point (collective then)."""
        self._require_controller()
        self._joined = False
        if self.local:
            if not self._optimizers:  # NOTE: without them the phase change could not align the replicas
                raise RuntimeError("hetero: mode='hybrid' needs runtime.before_optimizer_step(optimizer) before "
                                   "each optimizer step: it clips the local gradient and registers the optimizer, "
                                   "whose per-rank state is averaged on entering the synchronous phase")
            self.synced = self.controller.step_end(samples, self.schedule.period)
        else:
            self.controller.synchronous_step()
            self.synced = True
        self.points += int(self.synced)
        return self.synced

    def join(self) -> None:
        """This rank's data ran out (epoch end): take part in the remaining syncs until every rank
        joined (collective); then every rank holds the same model. Nothing in the synchronous phase,
        nor right after a join with no local step since (every rank then stands at the same model,
        so an adapter may join wherever ranks meet: the epoch's end, before validation, at close)."""
        if self.local and not self._joined:
            self._require_controller()
            self.controller.join()
            self.synced = True
            self.points += 1
            self._joined = True

    def evaluated(self, val_loss: float) -> bool:
        """One evaluation, on every rank at a sync point (collective in local phases); True on a switch."""
        if self.local and self.controller is not None and (self.controller.count or self.controller.joined):
            raise RuntimeError(f"hetero: evaluated() after {self.controller.count} local step(s) of a period, or "
                               "while a rank waits in join(): in a local-SGD phase the ranks' models and step counts "
                               "differ; evaluate right after a sync (runtime.synced is True) or after join()")
        switched = self.schedule.evaluated(val_loss)
        if switched and not self.local and self.controller is not None:
            self.controller.enter_synchronous([o for o in (ref() for ref in self._optimizers) if o is not None])
        return switched

    def metrics(self) -> dict[str, float]:
        """Phase, period, sync count and the last sync's per-rank steps and weights: the same on
        every rank, with no collective (they come from the last sync's all-gather)."""
        out = {"hybrid/phase": self.schedule.phase, "hybrid/period": self.schedule.period,
               "hybrid/syncs": 0 if self.controller is None else self.controller.syncs}
        last = None if self.controller is None else self.controller.last
        if last is not None:
            out.update({f"hybrid/steps_r{r}": s for r, s in enumerate(last["steps"])})
            out.update({f"hybrid/weight_r{r}": w for r, w in enumerate(last["weights"])})
            out["hybrid/delta_bytes_sent"] = self.controller.exchange.bytes_sent
        return out

    def sync_points(self, steps: int) -> int:
        """What checkpoints and metrics are scheduled by, the same on every rank: the synced points,
        not the optimizer ``steps`` (which differ between ranks in local phases)."""
        return self.points

    def require_synced(self, what: str) -> None:
        """Refuse a collective or a save (``what``) where the ranks' models and step counts differ."""
        if not self.synced:
            raise RuntimeError(f"hetero: {what} inside a local-SGD period (mode='hybrid'): the ranks' models and "
                               "step counts differ here, and a collective would deadlock; do it where runtime.synced "
                               "is True (after a sync, after join(), at an epoch's end)")

    def check_local_clipping(self, optimizers: Any, loss_scaled: bool) -> None:
        """Refuse local clipping where the gradients are still scaled when it runs (``loss_scaled``:
        fp16 loss scaling, and an optimizer that unscales inside its own step, as fused ones do).
        Collective with ``local_clip_norm`` set: every rank raises if any rank must."""
        norm = self.config.local_clip_norm
        if norm is None:
            return
        # the flag torch's GradScaler reads: the optimizer unscales inside its own step
        fused = [type(o).__name__ for o in optimizers if getattr(o, "_step_supports_amp_scaling", False)]
        mine = 1.0 if loss_scaled and fused else 0.0
        ranks = [r for r, (flag,) in enumerate(all_gather_floats([mine])) if flag]
        if ranks:
            name = f"{fused[0]}(fused=True)" if mine else "a fused optimizer"
            raise ConfigError(f"local_clip_norm={norm!r} is invalid with {name} under fp16 mixed "
                              f"precision (on rank(s) {ranks}): the optimizer unscales the gradients inside its "
                              "step, so the local clipping would act on scaled gradients; pass "
                              "local_clip_norm=None, or an optimizer without fused=True")

    def anchor_state(self, module_state: dict[str, Any]) -> dict[str, Any]:
        """The model a checkpoint writes once for all ranks: the anchor mid-period."""
        return module_state if self.controller is None else self.controller.anchor_state(module_state)

    def _require_controller(self) -> None:
        if self.controller is None:
            raise RuntimeError("hetero: mode='hybrid' needs runtime.register_hook(ddp_model) before training")

    # ---- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        local = self.controller.state_dict() if self.controller is not None else self._pending
        return {"schedule": self.schedule.state_dict(), "local": local, "points": self.points, "joined": self._joined}

    def shared_state_dict(self) -> dict[str, Any]:
        """What any world size can resume from: the phase, its history and the sync count (the
        model is the anchor; the ranks' steps since the last sync are per rank and lost)."""
        return {"schedule": self.schedule.state_dict(), "points": self.points, "joined": self._joined,
                "local": {"syncs": self.points, "count": 0, "samples": 0.0}}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.schedule.load_state_dict(state["schedule"])
        self.points = int(state.get("points", 0))
        self._joined = bool(state.get("joined", False))  # a save right after a join: the same join is not redone
        if state.get("local") is None:
            return
        if self.controller is None:
            self._pending = state["local"]
        else:
            self.controller.load_state_dict(state["local"])
