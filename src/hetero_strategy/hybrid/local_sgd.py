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

Optimizer state (momentum, Adam moments) stays per rank during local phases: averaging it would
cost another model-sized exchange per period. Since the update is linear in it, plain SGD and
momentum SGD with H = 1 and weights b_r / G still equal synchronous SGD on the global batch. On
entering the synchronous phase it is averaged once (weighted like the last sync; ``step``
counters take the maximum), so DDP's replicas stay identical from then on, and compression's
residuals are sent then, densely.

NOTE on DDP buffers: ``no_sync`` stops the gradient all-reduce but not, on the first forward
after a synchronized one, the broadcast of module buffers (``require_forward_param_sync`` lags
one forward). That broadcast happens at each rank's first local step after synchronous training,
the same point on every rank, so it cannot deadlock; afterwards the averaged buffers stand in.
Integer buffers (BatchNorm's ``num_batches_tracked``) stay per rank.
"""

from __future__ import annotations

import contextlib
import logging
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from hetero_strategy.config import HybridConfig
from hetero_strategy.dist import StallError, device_for, job_store, reduce_flat
from hetero_strategy.hybrid.exchange import DeltaExchange

__all__ = ["LocalSGD", "staleness_weights"]

log = logging.getLogger("hetero_strategy")


def staleness_weights(steps: list[int], samples: list[float], decay: float) -> list[float]:
    """``samples_r · decay^(max(steps) - steps_r)``, normalised to sum 1 (all 0 when no samples)."""
    lead = max(steps)
    raw = [n * decay ** (lead - s) for s, n in zip(steps, samples, strict=True)]
    total = sum(raw)
    return [w / total if total > 0 else 0.0 for w in raw]


class LocalSGD:
    """The local-step controller of one rank: counts, the store protocol, the anchor and the sync.

    Args:
        config: the ``hybrid`` section.
        module: the model under DDP (its parameters and floating buffers are averaged).
        rank: this rank in ``group``.
        world_size: the size of ``group``.
        group: the process group of the syncs (default: the default group).
        phase: a context for collectives (the runtime's stall watch: a vanished peer raises).
    """

    def __init__(self, config: HybridConfig, module: torch.nn.Module, rank: int, world_size: int, *,
                 group: dist.ProcessGroup | None = None,
                 phase: Callable[[str], contextlib.AbstractContextManager] | None = None,
                 stall_timeout_s: float = 60.0) -> None:
        # hyper-parameters
        self.config, self.rank, self.world_size, self.group = config, rank, world_size, group
        self.stall_timeout_s = stall_timeout_s
        self._phase = phase or (lambda where: contextlib.nullcontext())
        # what is averaged, by name (parameters, then floating buffers)
        self.tensors = {**dict(module.named_parameters()),
                        **{n: b for n, b in module.named_buffers() if b.is_floating_point()}}
        # internal state: the period's counts, the anchor (tensors at the last sync)
        self.syncs = 0      # periods ended: the same on every rank
        self.count = 0      # local steps this period
        self.samples = 0.0  # samples of those steps
        self.anchor: dict[str, torch.Tensor] | None = None
        self._restored: dict[str, torch.Tensor] | None = None  # this rank's local tensors from a checkpoint
        self._published = 0
        self.joined: set[int] = set()  # ranks whose data ran out (known since the last sync)
        self.last: dict[str, list] | None = None  # the last sync's steps, samples, weights (logs, tests)
        self._phase_samples: list[float] | None = None  # every rank's samples in this phase's syncs
        self.exchange = DeltaExchange(config.delta_density, world_size, group)
        self._store = None
        if world_size > 1:  # every rank builds its controllers in the same order
            self._store = job_store("hybrid")

    # ---- one local step ------------------------------------------------------------------
    def begin_step(self) -> None:
        """Before a local step's forward: the period's anchor (and a checkpoint's local tensors)."""
        if self.anchor is None:
            self.anchor = {n: t.detach().float().clone() for n, t in self.tensors.items()}
        if self._restored is not None:
            with torch.no_grad():
                for n, t in self.tensors.items():
                    t.copy_(self._restored[n])
            self._restored = None
        if self._store is not None and self.count > self._published:  # a resumed count, before peers look
            self._store.add(self._key(self.rank), self.count - self._published)
            self._published = self.count

    def clip(self) -> None:
        norm = self.config.local_clip_norm
        if norm is not None:
            params = [t for t in self.tensors.values() if isinstance(t, torch.nn.Parameter) and t.grad is not None]
            torch.nn.utils.clip_grad_norm_(params, norm)

    def step_end(self, samples: float, period: int) -> bool:
        """A local optimizer step ended: count it; run the sync when the period is over (True)."""
        if self.anchor is None:
            raise RuntimeError("hetero: a local step ran outside runtime.local_step(ddp_model): wrap each "
                               "forward and backward of hybrid training in it (a loop or adapter that does not "
                               "drive the hybrid events cannot run mode='hybrid')")
        self.count += 1
        self.samples += samples
        if self._store is None:
            done = self.count >= period
        else:
            self._store.add(self._key(self.rank), self.count - self._published)
            self._published = self.count
            if self.count >= period or self._leads_by_tau():
                self._store.set(self._key("go"), "1")
            done = self._store.check([self._key("go")])
        if done:
            self.sync()
        return done and not self.joined

    def _key(self, name: Any) -> str:
        return f"{self.syncs}/{name}"

    def _leads_by_tau(self) -> bool:
        tau = self.config.max_staleness
        if self.count < tau:  # nobody can be tau behind yet
            return False
        # add(key, 0) reads a peer's counter without waiting for it to exist
        peers = [r for r in range(self.world_size) if r != self.rank and r not in self.joined]
        if not peers:
            return False
        behind = min(self._store.add(self._key(r), 0) for r in peers)
        return self.count - behind >= tau

    # ---- the end of the data -------------------------------------------------------------
    def join(self) -> None:
        """This rank has no more data: sync now, then join every sync with no steps until every
        rank joined (collective); afterwards every rank holds the same model."""
        self.begin_step()  # an anchor even when no step ran since the last phase change
        if self._store is None:
            if self.count:
                self.sync()
            return
        self._store.set(self._key("go"), "1")
        while not self.sync(joined=True):
            self._wait_for_period_end()

    def _wait_for_period_end(self) -> None:
        """Wait for an active rank to end the period; a peer whose counter stops for
        ``stall_timeout_s`` is an error, not a hang."""
        active = [r for r in range(self.world_size) if r not in self.joined]
        seen, since = None, time.monotonic()
        while not self._store.check([self._key("go")]):
            counts = [self._store.add(self._key(r), 0) for r in active]
            if counts != seen:
                seen, since = counts, time.monotonic()
            elif time.monotonic() - since > self.stall_timeout_s:
                raise StallError(f"hetero: rank {self.rank} joined (no data left) and waited more than "
                                 f"stall_timeout_s={self.stall_timeout_s:g} s for rank(s) {active} to take a local "
                                 f"step in period {self.syncs}; they are frozen or gone")
            time.sleep(0.01)

    # ---- the sync ------------------------------------------------------------------------
    def sync(self, joined: bool = False) -> bool:
        """Average the period's deltas with staleness weights (collective); True once every rank
        joined (then the next period starts with every rank active again)."""
        with self._phase("hybrid sync"):
            delta = self._delta()  # (numel,) fp32
            finite = bool(torch.isfinite(delta).all())  # one host sync a period
            steps, samples, flags, ok = self._gather_counts(joined, finite)
            # NOTE: a rank whose model went non-finite (diverged) weighs 0: its NaN must not reach the anchor
            weights = staleness_weights(steps, [n if f else 0.0 for n, f in zip(samples, ok)],
                                        self.config.staleness_decay)
            w = weights[self.rank]
            self._add_to_anchor(self.exchange.reduce(delta.mul_(w) if w > 0 else delta.zero_()))
        if not all(ok) and self.rank == 0:
            log.warning("hetero: hybrid sync %d: the model of rank(s) %s is not finite; their steps of this "
                        "period are left out of the average", self.syncs, [r for r, f in enumerate(ok) if not f])
        self.last = {"steps": steps, "samples": samples, "weights": weights}
        # every rank's samples this phase: the weights of its optimizer state at the switch to synchronous
        self._phase_samples = [a + b * f for a, b, f in zip(self._phase_samples or [0.0] * len(samples), samples, ok)]
        log.debug("hetero: hybrid sync %d: steps %s, samples %s, weights %s", self.syncs, steps, samples, weights)
        self._clear_keys()
        self.syncs += 1
        self.count, self.samples, self._published = 0, 0.0, 0
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

    @torch.no_grad()
    def _delta(self) -> torch.Tensor:
        """This rank's tensors minus the anchor, flat (numel,) fp32."""
        return torch.cat([(t.float() - self.anchor[n]).reshape(-1) for n, t in self.tensors.items()])

    @torch.no_grad()
    def _add_to_anchor(self, flat: torch.Tensor) -> None:
        """anchor += flat (numel,) fp32, then every averaged tensor := anchor."""
        anchor = self.anchor
        offset = 0
        for n, t in self.tensors.items():
            a = anchor[n]
            a.add_(flat[offset:offset + a.numel()].view_as(a))
            t.copy_(a)
            offset += a.numel()

    def _clear_keys(self) -> None:
        # NOTE: after the all-gather nobody reads this period's keys; a store without delete keeps them
        if self._store is not None:
            with contextlib.suppress(Exception):
                self._store.delete_key(self._key(self.rank))
                if self.rank == 0:
                    self._store.delete_key(self._key("go"))

    def synchronous_step(self) -> None:
        """A step of the synchronous phase (DDP averaged it): a sync point like any period's end."""
        self.syncs += 1

    # ---- phase change --------------------------------------------------------------------
    @torch.no_grad()
    def enter_synchronous(self, optimizers: list[Any]) -> None:
        """Entering the synchronous phase: one model and one optimizer state on every rank (collective).

        Compression's residuals are added densely; floating optimizer state is averaged with each
        rank's share of the samples of the phase's syncs (the last sync alone may hold only the
        last rank to finish its data); ``step`` counters take the max.
        """
        if self.exchange.sparse():  # the same answer on every rank
            self.begin_step()  # an anchor even if no local step ran
            first = next(iter(self.tensors.values()))
            flat = self.exchange.flush(sum(t.numel() for t in self.tensors.values()), first.device)
            with self._phase("hybrid phase change"):
                self._add_to_anchor(self.exchange.reduce(flat, dense=True))
        shares = self._phase_samples
        weight = 1.0 / self.world_size if not shares or sum(shares) == 0 else shares[self.rank] / sum(shares)
        states = [s for opt in optimizers for s in opt.state.values()]
        means = [v for s in states for k, v in s.items() if torch.is_tensor(v) and v.is_floating_point() and k != "step"]
        steps = [v for s in states for k, v in s.items() if torch.is_tensor(v) and k == "step"]
        if self.world_size > 1:
            with self._phase("hybrid phase change"):
                reduce_flat(means, dist.ReduceOp.SUM, self.group, scale=weight)
                reduce_flat(steps, dist.ReduceOp.MAX, self.group)
        self.anchor = None

    # ---- state ---------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        """Counts, and mid-period the anchor and this rank's own tensors (a sync boundary needs
        neither: every rank's model is the anchor)."""
        state: dict[str, Any] = {"syncs": self.syncs, "count": self.count, "samples": self.samples,
                                 "last": self.last, "phase_samples": self._phase_samples, "exchange": self.exchange.state_dict()}
        if self.count > 0 or self._restored is not None:
            state["anchor"] = {n: a.clone() for n, a in self.anchor.items()}
            local = self._restored or {n: t.detach().clone() for n, t in self.tensors.items()}
            state["local"] = {n: t.clone() for n, t in local.items()}
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore; mid-period the local tensors go into the model at the next local step (after
        whatever the framework loads into it, e.g. the anchor a checkpoint's model holds)."""
        self.syncs, self.count, self.samples = int(state["syncs"]), int(state["count"]), float(state["samples"])
        self.last = state.get("last")
        self._phase_samples = state.get("phase_samples")
        self.exchange.load_state_dict(state.get("exchange") or {})
        self._published = 0  # a new store prefix (restart) or a new controller: nothing published yet
        self.anchor = {n: a.clone() for n, a in state["anchor"].items()} if "anchor" in state else None
        self._restored = {n: t.clone() for n, t in state["local"].items()} if "local" in state else None

    def anchor_state(self, module_state: dict[str, Any]) -> dict[str, Any]:
        """``module.state_dict()`` with the anchor in place of this rank's local tensors: the same
        model on every rank, mid-period too (a checkpoint writes the model once)."""
        if self.anchor is None or self.count == 0:
            return module_state
        return {k: self.anchor[k].to(v.dtype) if k in self.anchor else v for k, v in module_state.items()}

