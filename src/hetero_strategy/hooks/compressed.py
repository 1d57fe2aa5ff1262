"""Compressed, sample-weighted DDP comm hooks: Top-K / tiered and 1-bit sign, with error feedback.

The bucket is first scaled by this rank's weight b_r/G (as the dense weighted hook does), so with
density 1.0 the result equals :func:`weighted_allreduce_hook`. Each step a bucket takes one mode,
decided from the step number alone, so all ranks agree without communicating:

* ``warmup`` — dense weighted all-reduce, no residuals (DDP rebuilds its buckets after step 1);
* ``dense`` — dense all-reduce of g + gamma*residual, residual flushed to zero: the periodic
  full-precision sync, and the fallback when a sparse payload would cost more than dense;
* ``sparse`` — Top-K of g + gamma*residual (k per rank from its tier and the schedule), padded to
  the largest k across ranks and exchanged by one all-gather; a rank that skips this step's
  exchange sends k = 0 and keeps everything in its residual;
* ``onebit`` — signs and one scale per rank, one all-gather.

With ``dense_fallback`` (the default) the state measures the link and its own codec when it is
built (:mod:`.cost`): a parameter whose compression would take longer than sending it goes whole,
and a bucket made only of such parameters takes the plain all-reduce (mode ``dense_fallback``,
metric ``comm/dense_fallback``). On a fast link, asking for Top-K then costs nothing.

Non-finite gradients (GradScaler overflow) are never written into a residual, and they surface:
a bucket holding NaN/inf on any rank comes back all-NaN on every rank, so found-inf skips the step
everywhere. Detection is a 0-d tensor riding in the payload: no host sync inside the hook.

Example::

    state = CompressedState(method="topk", base_density=0.01, dense_warmup_steps=10)
    ddp_model.register_comm_hook(state, topk_hook)   # the hooks: hooks/compressed_hooks.py
    # per step: state.set_local_batch(b_r, G); backward; state.last_bytes_sent, state.density
"""

# NOTE: no `from __future__ import annotations`: DDP checks the hook's real annotation objects.
import dataclasses
import logging
import math
from collections.abc import Callable

import torch
import torch.distributed as dist

from hetero_strategy.cluster.wire import wire_entries
from hetero_strategy.config import CompressionConfig
from hetero_strategy.dist import device_for
from hetero_strategy.hooks import communicator as comm
from hetero_strategy.hooks.cost import CompressionCost, measure_compression_cost
from hetero_strategy.hooks.hierarchy import build_fast_groups
from hetero_strategy.hooks.memory import ResidualMemory
from hetero_strategy.hooks.schedule import DensitySchedule
from hetero_strategy.hooks.streams import SideStreams
from hetero_strategy.hooks.tiers import TierPolicy, exchange_codec, exchange_policies
from hetero_strategy.hooks.topk_ef import TopKPlan, TopKState
from hetero_strategy.hooks.weighted import WeightedReduceState

__all__ = ["CompressedState"]

log = logging.getLogger(__name__)


class CompressedState(WeightedReduceState):
    """State of :func:`topk_hook` / :func:`onebit_hook` (construct on every rank: it is collective).

    Args:
        config: a :class:`CompressionConfig`; or pass its fields as keywords.
        process_group: the group to reduce over (None: the default group).
        max_steps: the run's length, the cosine period when ``density_period`` is None; or a
            callable giving it, read at the first compressed step (e.g. Lightning's estimated
            stepping batches, known only once the data is set up).

    Tuning: the defaults (base_density 0.05, floor 0.005, 10 dense warm-up steps) stayed within a
    point of dense on the bench's CNN; lower them for large models on slow links; a dense sync
    every 100 steps bounds drift; use clip_norm when the loss spikes early.
    """

    __slots__ = [  # grouped by role, as in PyTorch's hook states
        # hyper-parameters
        "config", "schedule", "policies", "tiers", "codec", "rank", "world", "exchange_group", "hier", "_period_source",
        # internal state
        "cost", "memory", "topk", "dirty", "streams", "total_numel", "_numel_seen", "_acc_recv", "_acc_entries", "_acc_numel",
        "_acc_fallback", "_acc_measured",
        # stats
        "density", "dense_fallback", "total_bytes_sent", "total_bytes_received", "last_entries_sent",
        "last_modes", "_modes",
    ]  # fmt: skip

    def __init__(self, config: "CompressionConfig | None" = None, process_group: "dist.ProcessGroup | None" = None,
                 *, max_steps: "int | Callable[[], int | float] | None" = None, **fields) -> None:
        super().__init__(process_group)
        if config is None:
            fields.setdefault("method", "topk")
            config = CompressionConfig(**fields)
        elif fields:
            raise TypeError("pass either config or keyword fields, not both")
        if config.method not in ("topk", "topk_allreduce", "tiered", "onebit"):
            raise ValueError(f"compression={config.method!r} is invalid for CompressedState: use topk, topk_allreduce, "
                             "tiered or onebit (fp16/bf16/powersgd have their own states, see build_comm_hook)")
        self.config = config
        self.rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        self.world = comm.world_size(process_group)
        self.exchange_group, self.hier = process_group, None
        if config.hierarchical and self.world > 1:
            if process_group is not None:
                raise ValueError("hierarchical=True is invalid with a custom process_group: it groups the "
                                 "default group's ranks; pass process_group=None")
            self.hier = build_fast_groups(config.fast_groups)
            # leaders run the compressed exchange among themselves; the rest only reduce densely
            self.exchange_group = self.hier.cross
            self.rank, self.world = self.hier.leaders.index(self.hier.leader), len(self.hier.leaders)
        self._period_source = None if config.density_period or not callable(max_steps) else max_steps
        fixed = max_steps if isinstance(max_steps, int) and max_steps > 0 else None
        period = config.density_period or fixed or 1000
        self.schedule = DensitySchedule(config.base_density, config.density_floor, config.dense_warmup_steps, period,
                                        config.density_schedule == "cosine", config.density_warmup == "exponential")
        if config.method == "tiered":  # collective: every rank's tier is gathered
            self.tiers, self.policies = exchange_policies(config, self.exchange_group,
                                                          None if self.hier is None else self.hier.groups)
        else:
            self.tiers, self.policies = None, [TierPolicy(1.0, 1, config.ef_gamma)] * self.world
        self.codec = exchange_codec(config.method, self.tiers, self.policies)[0]  # the exchange's, on every rank
        if self.hier is not None and not self.hier.is_leader:  # never compresses: its group's leader does
            self.tiers, self.policies = None, [TierPolicy(None, 1, 1.0)] * self.world
        self.cost = self._measure_cost(process_group)
        self.memory = ResidualMemory()
        # the Top-K exchange over the (leaders') exchange group, on the same residuals
        self.topk = TopKState.for_config(config, self.exchange_group, self.memory, self.codec == "topk_allreduce")
        self.streams = SideStreams(enabled=config.side_streams)
        # NOTE: parameters (ordinals) that may hold a residual, from the agreed plan only, so every rank
        # agrees on which buckets may skip the codec; flat exchanges only (hierarchical ones never take
        # that shortcut). A NaN step keeps its old residual while the set says clean: it is used
        # again when the parameter next goes sparse, and checkpointed meanwhile.
        self.dirty: set[int] = set()
        self.total_numel, self._numel_seen = None, 0  # the model's entries, once the first step has seen them
        self._reset_step_stats()
        self.density, self.dense_fallback, self.last_entries_sent = 1.0, 0.0, 0
        self.last_bytes_sent = self.last_bytes_received = self.total_bytes_sent = self.total_bytes_received = 0
        self.last_modes: dict[int, str] = {}

    def _measure_cost(self, process_group: "dist.ProcessGroup | None") -> "CompressionCost | None":
        """The link and codec measurement behind ``dense_fallback`` (collective over every rank of
        ``process_group``, leaders or not); None when it is off or there is nothing to exchange."""
        cfg = self.config
        if not cfg.dense_fallback or cfg.method == "onebit" or comm.world_size(process_group) < 2:
            return None
        cost = measure_compression_cost(process_group, device_for(process_group), cfg.compression_backend,
                                        cfg.base_density)
        k = self.schedule.k_for(big := 1 << 24, cfg.base_density)  # a large bucket at the base density
        if dist.get_rank() == 0 and not cost.sparse_pays(big, k, self.world, self.codec == "topk_allreduce"):
            log.warning("compression=%r does not pay on this link (%s): gradients are sent densely "
                        "(dense_fallback=False compresses anyway)", cfg.method, cost.describe())
        return cost

    def all_dense(self) -> bool:
        """Every member of the exchange is on a dense tier: a plain all-reduce, no residuals."""
        return all(p.tier_factor is None for p in self.policies)

    def _reset_step_stats(self) -> None:
        self._acc_sent = self._acc_recv = self._acc_entries = self._acc_numel = self._acc_fallback = 0
        self._acc_measured, self._modes = 0, {}  # measured: a device count under threshold selection

    # ---- per-step decisions (identical on every rank) --------------------------------------
    def mode(self, step: int) -> str:
        """warmup, dense (periodic full-precision sync) or compressed, from the step alone."""
        if self.schedule.in_warmup(step):
            return "warmup"
        if self._period_source is not None:
            self._resolve_period()
        every = self.config.dense_sync_every
        if every and step > self.schedule.warmup_steps and step % every == 0:
            return "dense"
        return "compressed"

    def _resolve_period(self) -> None:
        """Replace the default period by the run's length once it is known (same on every rank)."""
        source, self._period_source = self._period_source, None
        try:
            steps = source()
        except Exception:  # noqa: BLE001 - NOTE: no length (e.g. an iterable dataset): keep the default
            return
        if isinstance(steps, (int, float)) and math.isfinite(steps) and steps > 0:
            self.schedule = dataclasses.replace(self.schedule, period=int(steps))

    def plan(self, step: int, sizes: "list[int]") -> TopKPlan:
        """Per parameter of a bucket: sparse?, this rank's k, capacity (max k over ranks; more under
        threshold selection), sent whole because compressing it does not pay? (a :class:`TopKPlan`).
        Decided per parameter (not per bucket) so that results do not depend on DDP's bucket
        layout, which changes after step 1 and differs again after a resume. A parameter goes
        dense when its gathered values+indices would outweigh a ring all-reduce (cap x W >= n),
        or, with a measured ``cost`` (``dense_fallback``), when compressing it takes longer than
        sending it; then every rank sends it whole, skipping or not.
        """
        densities = []  # per rank; 0 for a rank skipping this step's exchange
        for p in self.policies:
            # a dense tier has no residual to keep a skipped gradient in, so it never skips
            skip = p.tier_factor is not None and (step - self.schedule.warmup_steps) % p.exchange_every != 0
            densities.append(0.0 if skip else self.schedule.density(step, p.tier_factor))
        shared = self.topk.agreement is not None
        mine_d, max_d = densities[self.rank], max(densities)
        if shared:  # one k for all at shared indices: the sparsest policy's, skipping or not
            max_d = min(self.schedule.density(step, p.tier_factor) for p in self.policies)
        sparse, mine, caps, whole = [], [], [], []
        for n in sizes:
            cap = self.topk.capacity(self.schedule.k_for(n, max_d), n)  # from the largest k over ranks
            # NOTE: with a cost, sparse_pays implies a wire smaller than n (the codec only adds time)
            pays = (wire_entries(cap, self.world, shared) < n if self.cost is None
                    else self.cost.sparse_pays(n, cap, self.world, shared))
            sparse.append(pays)
            whole.append(not pays and self.cost is not None)
            k = (cap if mine_d > 0 else 0) if shared else self.schedule.k_for(n, mine_d)
            mine.append(n if whole[-1] else k)
            caps.append(cap if pays else n)
        return TopKPlan(sparse, mine, caps, whole)

    def stages_for(self, sizes: "list[int]", sparse: "list[bool]", caps: "list[int]") -> int:
        """Chunks to cut a bucket into (``pipeline_stages``); "auto": ceil(T_codec / T_comm) + 1,
        1 to 8, from the measured codec and link (the same on every rank), 1 without a measurement."""
        stages = self.config.pipeline_stages
        if stages != "auto":
            return stages
        if self.cost is None or not any(sparse):
            return 1
        t_codec = self.cost.codec_s_per_entry * sum(sizes)
        shared = self.topk.agreement is not None
        wire = sum(wire_entries(c, self.world, shared) if s else c for c, s in zip(caps, sparse))  # as in sparse_pays
        t_comm = 4.0 * wire / self.cost.link_bytes_per_s
        return min(8, max(1, math.ceil(t_codec / max(t_comm, 1e-12)) + 1))

    def metrics(self) -> dict[str, float]:
        """Last step's communication, for a logger: bytes sent/received by this rank, planned density, the
        entries it actually sent and their density (selection="threshold": a device count, read here)."""
        sent = float(self.last_entries_sent)
        return {"comm/bytes_sent": float(self.last_bytes_sent), "comm/bytes_received": float(self.last_bytes_received),
                "comm/density": float(self.density), "comm/dense_fallback": float(self.dense_fallback),
                "comm/entries_sent": sent, "comm/density_sent": sent / max(self.total_numel or 1, 1)}

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        out = super().state_dict()
        out.update(self.memory.state_dict(), total_numel=self.total_numel, tiers=self.tiers, dirty=sorted(self.dirty),
                   total_bytes_sent=self.total_bytes_sent, total_bytes_received=self.total_bytes_received)
        return {**out, **self.topk.state_dict()}  # index sets, thresholds, velocities: a resume sends alike

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.memory.load_state_dict(state)
        self.dirty = set(state.get("dirty", ())) if self.hier is None else set()
        self.total_numel = state.get("total_numel")
        self.total_bytes_sent = int(state.get("total_bytes_sent", 0))
        self.total_bytes_received = int(state.get("total_bytes_received", 0))
        self.topk.load_state_dict(state)

    # ---- what the hooks do to a bucket and count of it ------------------------------------------
    def scale_bucket(self, bucket: dist.GradBucket, clip: bool) -> None:
        """``buffer *= b_r/G`` (unscaled by the loss scale), after clipping this rank's gradient to
        its share of ``clip_norm`` when ``clip``: the hooks' step 1, before any error feedback."""
        buf = bucket.buffer()
        if not clip or self.config.clip_norm is None:
            buf.mul_(self.weight)
            return
        # parameter p gets clip_norm * sqrt(n_p / N), so the whole gradient's norm is <= clip_norm;
        # per parameter rather than per bucket, so the bucket layout does not matter
        total = self.total_numel or buf.numel()
        grads = bucket.gradients()
        norms = torch._foreach_norm(grads)  # per-parameter L2 norms, 0-d tensors
        for g, norm in zip(grads, norms):
            limit = self.config.clip_norm * math.sqrt(g.numel() / total)
            true_norm = norm / self.loss_scale  # the clip is in unscaled units (fp16 loss scaling)
            g.mul_(torch.clamp(limit / (true_norm + 1e-6), max=1.0) * self.weight)

    def add_wire_bytes(self, nbytes: int) -> None:
        """Count ``nbytes`` sent and received by this step's collectives beside a bucket's exchange
        (the hierarchical intra-group reduce and broadcast); :meth:`account` closes the step."""
        self._acc_sent += nbytes
        self._acc_recv += nbytes

    def account(self, bucket: dist.GradBucket, mode: str, sent: int, entries: int, fallback: int = 0,
                measured: "int | torch.Tensor | None" = None) -> None:
        """Record one bucket's exchange: ``mode`` (``last_modes``), bytes ``sent`` (received alike),
        ``entries`` planned, ``fallback`` of them sent whole as compressing does not pay, ``measured``
        actually sent (None: ``entries``). The step's last bucket closes its figures (``last_*``,
        ``density``, ``dense_fallback``, ``total_bytes_*``); call it once per bucket and step."""
        n = bucket.buffer().numel()
        self._acc_fallback += fallback
        self._acc_sent += sent
        self._acc_recv += sent  # ring collectives receive what they send
        self._acc_entries += entries
        self._acc_measured += entries if measured is None else measured
        self._acc_numel += n
        self._modes[bucket.index()] = mode
        if self.total_numel is None:
            self._numel_seen += n
        if bucket.is_last():
            if self.total_numel is None:
                self.total_numel = self._numel_seen
            self.last_bytes_sent, self.last_bytes_received = self._acc_sent, self._acc_recv
            self.total_bytes_sent += self._acc_sent
            self.total_bytes_received += self._acc_recv
            numel = max(self._acc_numel, 1)
            self.density, self.dense_fallback = self._acc_entries / numel, self._acc_fallback / numel
            self.last_entries_sent = self._acc_measured
            self.last_modes = self._modes
            self._reset_step_stats()
