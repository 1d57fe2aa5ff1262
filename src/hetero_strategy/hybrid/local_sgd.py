"""Local-SGD periods: unequal local step counts, coordinated through the store, one weighted sync.

One period, on every rank:

1. Local steps under ``ddp.no_sync()``: forward, backward, (clipping), the rank's own optimizer step.
2. After each step the rank adds 1 to its counter in the rendezvous store (no collective) and ends
   the period when it reached H itself, or when it leads a peer by ``max_staleness`` steps, by
   setting the period's flag. Every rank checks the flag after each of its steps, so every rank
   takes at least one step, the fastest at most H, and a rank only ever stops at the flag.
3. The sync, the same two collectives on every rank: an all-gather of ``[steps_r, samples_r]``,
   then one exchange of the weighted deltas ``w_r (x_r - anchor)`` over parameters and floating
   buffers (an fp32 all-reduce; with ``delta_density`` a Top-K all-gather, error feedback keeping
   the rest), with ``w_r ∝ samples_r · decay^(max_s steps_s - steps_r)`` (summing to 1).
   ``anchor += sum``; every rank's tensors := anchor. Nothing is dropped: a late rank's work is
   in the average with a smaller weight, and what compression held back is sent later.

A rank whose data ran out calls :meth:`LocalSGD.join`: it ends the current period at once (so
everyone learns it joined), then takes part in every later sync with no steps (weight 0) until
every rank joined; the active ranks leave it out of the staleness bound meanwhile.

Optimizer state (momentum, Adam moments) stays per rank during local phases; on entering the
synchronous phase it is averaged once (:func:`~hetero_strategy.hybrid.optimizers.align_optimizers`),
so DDP's replicas stay identical from then on, and compression's residuals are sent then, densely.

The pieces, one file each: the staleness weights (:mod:`.staleness`), the store protocol of a
period's end (:mod:`.period_store`), the averaged tensors and their anchor (:mod:`.anchor`), the
delta exchange (:mod:`.exchange`) and the optimizer alignment (:mod:`.optimizers`).

NOTE on DDP buffers: ``no_sync`` stops the gradient all-reduce but not, on the first forward
after a synchronized one, the broadcast of module buffers (``require_forward_param_sync`` lags
one forward). That broadcast happens at each rank's first local step after synchronous training,
the same point on every rank, so it cannot deadlock; afterwards the averaged buffers stand in.
Integer buffers (BatchNorm's ``num_batches_tracked``) stay per rank.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import HybridConfig
from hetero_strategy.dist import device_for
from hetero_strategy.hybrid.anchor import ModelAnchor
from hetero_strategy.hybrid.exchange import DeltaExchange
from hetero_strategy.hybrid.optimizers import align_optimizers
from hetero_strategy.hybrid.period_store import PeriodStore
from hetero_strategy.hybrid.staleness import staleness_weights

__all__ = ["LocalSGD"]

log = logging.getLogger("hetero_strategy")


class LocalSGD:
    """The local-step controller of one rank: counts, the period's end, the anchor and the sync.

    Args:
        config: the ``hybrid`` section.
        module: the model under DDP (its parameters and floating buffers are averaged).
        rank: this rank in ``group``.
        world_size: the size of ``group``.
        group: the process group of the syncs (default: the default group).
        phase: a context for collectives (the runtime's stall watch: a vanished peer raises).
        stall_timeout_s: how long a joined rank waits for a peer's next local step.
    """

    def __init__(self, config: HybridConfig, module: torch.nn.Module, rank: int, world_size: int, *,
                 group: dist.ProcessGroup | None = None,
                 phase: Callable[[str], contextlib.AbstractContextManager] | None = None,
                 stall_timeout_s: float = 60.0) -> None:
        # hyper-parameters
        self.config, self.rank, self.world_size, self.group = config, rank, world_size, group
        self._phase = phase or (lambda where: contextlib.nullcontext())
        # internal state: the period's counts, the averaged tensors and their anchor
        self.model = ModelAnchor(module)
        self.syncs = 0      # periods ended: the same on every rank
        self.count = 0      # local steps this period
        self.samples = 0.0  # samples of those steps
        self.joined: set[int] = set()  # ranks whose data ran out (known since the last sync)
        self.last: dict[str, list] | None = None  # the last sync's steps, samples, weights (logs, tests)
        self._phase_samples: list[float] | None = None  # every rank's samples in this phase's syncs
        self.exchange = DeltaExchange(config.delta_density, world_size, group,
                                      shared_indices=config.delta_codec == "topk_allreduce")
        # every rank builds its controllers in the same order (the store prefix counts them)
        self._board = PeriodStore(rank, world_size, stall_timeout_s) if world_size > 1 else None
        self._resumed = False  # restored, and the resumed count not yet published (every rank alike)

    @property
    def anchor(self) -> dict[str, torch.Tensor] | None:
        """The averaged tensors at the last sync, by name (fp32; None outside local phases)."""
        return self.model.anchor

    # ---- one local step ------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before a local step's forward: the period's anchor (and a checkpoint's local tensors)."""
        self.model.begin()
        if self._board is not None and self._resumed:  # the resumed counts, before any rank looks
            self._board.arrive(self.syncs, self.count)
            self._resumed = False

    def clip(self) -> None:
        norm = self.config.local_clip_norm
        if norm is not None:
            params = [t for t in self.model.tensors.values()
                      if isinstance(t, torch.nn.Parameter) and t.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, norm)

    def step_end(self, samples: float, period: int) -> bool:
        """A local optimizer step ended: count it; run the sync when the period is over (True)."""
        if self.model.anchor is None:
            raise RuntimeError("hetero: a local step ran outside runtime.local_step(ddp_model): wrap each "
                               "forward and backward of hybrid training in it (a loop or adapter that does not "
                               "drive the hybrid events cannot run mode='hybrid')")
        self.count += 1
        self.samples += samples
        if self._board is None:
            done = self.count >= period
        else:
            self._board.publish(self.syncs, self.count)
            if self.count >= period or self._leads_by_tau():
                self._board.end(self.syncs)
            done = self._board.ended(self.syncs)
        if done:
            self.sync()
        return done and not self.joined

    def _leads_by_tau(self) -> bool:
        tau = self.config.max_staleness
        if self.count < tau:  # nobody can be tau behind yet
            return False
        peers = [r for r in range(self.world_size) if r != self.rank and r not in self.joined]
        if not peers:
            return False
        return self.count - min(self._board.steps_of(self.syncs, r) for r in peers) >= tau

    # ---- the end of the data -------------------------------------------------------------
    def join(self) -> None:
        """This rank has no more data: sync now, then join every sync with no steps until every
        rank joined (collective); afterwards every rank holds the same model."""
        self.begin_step()  # an anchor even when no step ran since the last phase change
        if self._board is None:
            if self.count:
                self.sync()
            return
        self._board.end(self.syncs)
        while not self.sync(joined=True):
            self._board.wait_for_end(self.syncs, [r for r in range(self.world_size) if r not in self.joined])

    # ---- the sync ------------------------------------------------------------------------
    def sync(self, joined: bool = False) -> bool:
        """Average the period's deltas with staleness weights (collective); True once every rank
        joined (then the next period starts with every rank active again)."""
        with self._phase("hybrid sync"):
            delta = self.model.delta()  # (numel,) fp32
            finite = bool(torch.isfinite(delta).all())  # one host sync a period
            steps, samples, flags, ok = self._gather_counts(joined, finite)
            # NOTE: a rank whose model went non-finite (diverged) weighs 0: its NaN must not reach the anchor
            weights = staleness_weights(steps, [n if f else 0.0 for n, f in zip(samples, ok)],
                                        self.config.staleness_decay)
            w = weights[self.rank]
            self.model.advance(self.exchange.reduce(delta.mul_(w) if w > 0 else delta.zero_()))
        if not all(ok) and self.rank == 0:
            log.warning("hetero: hybrid sync %d: the model of rank(s) %s is not finite; their steps of this "
                        "period are left out of the average", self.syncs, [r for r, f in enumerate(ok) if not f])
        self.last = {"steps": steps, "samples": samples, "weights": weights}
        # every rank's samples this phase: the weights of its optimizer state at the switch to synchronous
        self._phase_samples = [a + b * f for a, b, f in zip(self._phase_samples or [0.0] * len(samples), samples, ok)]
        log.debug("hetero: hybrid sync %d: steps %s, samples %s, weights %s", self.syncs, steps, samples, weights)
        if self._board is not None:
            self._board.clear(self.syncs)
        self.syncs += 1
        self.count, self.samples = 0, 0.0
        self.joined = {r for r, f in enumerate(flags) if f}
        if len(self.joined) < self.world_size:
            return False
        self.joined = set()
        return True

    def _gather_counts(self, joined: bool, finite: bool) -> tuple[list[int], list[float], list[bool], list[bool]]:
        if self.world_size == 1:
            return [self.count], [self.samples], [joined], [finite]
        # NOTE: on the group's device: NCCL takes CUDA tensors only
        mine = torch.tensor([self.count, self.samples, float(joined), float(finite)], dtype=torch.float64,
                            device=device_for(self.group))
        every = [torch.empty_like(mine) for _ in range(self.world_size)]
        dist.all_gather(every, mine, group=self.group)
        return ([int(t[0]) for t in every], [float(t[1]) for t in every], [bool(t[2]) for t in every],
                [bool(t[3]) for t in every])

    def synchronous_step(self) -> None:
        """A step of the synchronous phase (DDP averaged it): a sync point like any period's end."""
        self.syncs += 1

    # ---- phase change --------------------------------------------------------------------
    def enter_synchronous(self, optimizers: list[Any]) -> None:
        """Entering the synchronous phase: one model and one optimizer state on every rank (collective).

        Compression's residuals are added densely; floating optimizer state is averaged with each
        rank's share of the samples of the phase's syncs (the last sync alone may hold only the
        last rank to finish its data); ``step`` counters take the max.
        """
        if self.exchange.sparse():  # the same answer on every rank
            self.model.begin()  # an anchor even if no local step ran
            with self._phase("hybrid phase change"):
                self.model.advance(self.exchange.flush(self.model.numel, self.model.device))
        shares = self._phase_samples
        weight = 1.0 / self.world_size if not shares or sum(shares) == 0 else shares[self.rank] / sum(shares)
        if self.world_size > 1:
            with self._phase("hybrid phase change"):
                align_optimizers(optimizers, weight, self.group)
        self.model.drop()

    # ---- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Counts, and mid-period the anchor and this rank's own tensors (a sync boundary needs
        neither: every rank's model is the anchor)."""
        return {"syncs": self.syncs, "count": self.count, "samples": self.samples, "last": self.last,
                "phase_samples": self._phase_samples, "exchange": self.exchange.state_dict(),
                **self.model.state_dict(mid_period=self.count > 0)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; mid-period the local tensors go into the model at the next local step."""
        self.syncs, self.count, self.samples = int(state["syncs"]), int(state["count"]), float(state["samples"])
        self.last = state.get("last")
        self._phase_samples = state.get("phase_samples")
        self.exchange.load_state_dict(state.get("exchange") or {})
        if self._board is not None:  # a new store prefix (restart) or a new controller: nothing published yet
            self._board.published = 0
            # NOTE: every rank restores alike (a collective resume), so every rank arrives at its next
            # local step or join; a peer then never reads this counter before the resumed count is in it
            self._resumed = True
        self.model.load_state_dict(state)

    def anchor_state(self, module_state: dict[str, Any]) -> dict[str, Any]:
        """``module.state_dict()`` with the anchor in place of this rank's local tensors: the same
        model on every rank, mid-period too (a checkpoint writes the model once)."""
        return self.model.anchor_state(module_state, mid_period=self.count > 0)
