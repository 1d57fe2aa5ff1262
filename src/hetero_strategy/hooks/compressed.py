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

Non-finite gradients (GradScaler overflow) are never written into a residual, and they surface:
a bucket holding NaN/inf on any rank comes back all-NaN on every rank, so found-inf skips the step
everywhere. Detection is a 0-d tensor riding in the payload: no host sync inside the hook.

Example::

    state = CompressedState(method="topk", base_density=0.01, dense_warmup_steps=10)
    ddp_model.register_comm_hook(state, topk_hook)
    # per step: state.set_local_batch(b_r, G); backward; state.last_bytes_sent, state.density
"""

# NOTE: no `from __future__ import annotations`: DDP checks the hook's real annotation objects.
import math

import torch
import torch.distributed as dist

from hetero_strategy.config import CompressionConfig
from hetero_strategy.hooks import communicator as comm
from hetero_strategy.hooks.codecs import SignCodec, TopKCodec, ef_accumulate
from hetero_strategy.hooks.memory import ResidualMemory
from hetero_strategy.hooks.schedule import DensitySchedule
from hetero_strategy.hooks.tiers import TierPolicy, gather_tiers, resolve_tier, tier_policy
from hetero_strategy.hooks.weighted import WeightedReduceState

__all__ = ["CompressedState", "onebit_hook", "topk_hook"]


class CompressedState(WeightedReduceState):
    """State of :func:`topk_hook` / :func:`onebit_hook` (construct on every rank: it is collective).

    Args:
        config: a :class:`CompressionConfig`; or pass its fields as keywords.
        process_group: the group to reduce over (None: the default group).
        max_steps: the run's length; the cosine period when ``density_period`` is None.

    Tuning: start from base_density 0.01 with 10 dense warm-up steps; lower min_density on slow
    links; a dense sync every 100 steps bounds drift; use clip_norm when the loss spikes early.
    """

    __slots__ = [
        # hyper-parameters
        "config", "schedule", "policies", "tiers", "rank", "world",
        # internal state
        "memory", "total_numel", "_numel_seen", "_acc_sent", "_acc_recv", "_acc_entries", "_acc_numel",
        # stats
        "density", "last_bytes_sent", "last_bytes_received", "total_bytes_sent", "total_bytes_received",
        "last_modes", "_modes",
    ]  # fmt: skip

    def __init__(self, config: "CompressionConfig | None" = None, process_group: "dist.ProcessGroup | None" = None,
                 *, max_steps: "int | None" = None, **fields) -> None:
        super().__init__(process_group)
        if config is None:
            fields.setdefault("method", "topk")
            config = CompressionConfig(**fields)
        elif fields:
            raise TypeError("pass either config or keyword fields, not both")
        if config.method not in ("topk", "tiered", "onebit"):
            raise ValueError(f"compression={config.method!r} is invalid for CompressedState: use topk, tiered "
                             "or onebit (fp16/bf16/powersgd have their own states, see build_comm_hook)")
        self.config = config
        self.rank = dist.get_rank(process_group) if dist.is_initialized() else 0
        self.world = comm.world_size(process_group)
        period = config.density_period or (max_steps if max_steps and max_steps > 0 else 1000)
        self.schedule = DensitySchedule(config.base_density, config.min_density, config.dense_warmup_steps,
                                        period, cosine=config.density_schedule == "cosine")
        self.tiers, self.policies = self._policies(config, process_group)
        self.memory = ResidualMemory()
        self.total_numel: int | None = None
        self._numel_seen = 0
        self._reset_step_stats()
        self.density = 1.0
        self.last_bytes_sent = self.last_bytes_received = 0
        self.total_bytes_sent = self.total_bytes_received = 0
        self.last_modes: dict[int, str] = {}

    def _policies(self, config: CompressionConfig, group) -> "tuple[list[str] | None, list[TierPolicy]]":
        if config.method != "tiered":
            return None, [TierPolicy(1.0, 1, config.ef_gamma)] * self.world
        if config.tiers is not None and len(config.tiers) != self.world:
            raise ValueError(f"tiers={config.tiers!r} is invalid: {len(config.tiers)} entries for "
                             f"{self.world} ranks; give one tier per rank")
        mine = resolve_tier(config.tiers[self.rank] if config.tiers else config.tier, group)
        tiers = gather_tiers(mine, group)
        return tiers, [tier_policy(t, config.tier_overrides) for t in tiers]

    def _reset_step_stats(self) -> None:
        self._acc_sent = self._acc_recv = self._acc_entries = self._acc_numel = 0
        self._modes: dict[int, str] = {}

    # ---- per-step decisions (identical on every rank) --------------------------------------
    def plan(self, step: int, numel: int) -> "tuple[str, list[int]]":
        """(mode, per-rank k) of a bucket of ``numel`` entries at ``step``."""
        cfg = self.config
        if self.schedule.in_warmup(step):
            return "warmup", [numel] * self.world
        every = cfg.dense_sync_every
        if every and step > self.schedule.warmup_steps and step % every == 0:
            return "dense", [numel] * self.world
        if cfg.method == "onebit":
            # signs cost n/8 bytes per rank to gather vs ~8n/W for a ring all-reduce of fp32
            cheaper = SignCodec.payload_numel(numel) < 8 * numel / self.world
            return ("onebit" if cheaper else "dense"), [numel] * self.world
        ks = []
        for p in self.policies:
            skip = (step - self.schedule.warmup_steps) % p.exchange_every != 0
            ks.append(0 if skip else self.schedule.k(numel, step, p.tier_factor))
        # the gather of values + indices moves 2*cap*W*4 bytes vs 2*n*4 for a ring all-reduce
        return ("sparse" if max(ks) * self.world < numel else "dense"), ks

    # ---- checkpoints -------------------------------------------------------------------------
    def state_dict(self) -> dict:
        out = super().state_dict()
        out.update(self.memory.state_dict(), total_numel=self.total_numel, tiers=self.tiers,
                   total_bytes_sent=self.total_bytes_sent, total_bytes_received=self.total_bytes_received)
        return out

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self.memory.load_state_dict(state)
        self.total_numel = state.get("total_numel")
        self.total_bytes_sent = int(state.get("total_bytes_sent", 0))
        self.total_bytes_received = int(state.get("total_bytes_received", 0))

    # ---- helpers used by the hooks -------------------------------------------------------------
    def _scale(self, buf: torch.Tensor, clip: bool) -> None:
        """buf *= b_r/G, after clipping this rank's gradient to its share of clip_norm."""
        if not clip or self.config.clip_norm is None:
            buf.mul_(self.weight)
            return
        # each bucket gets clip_norm * sqrt(n_b / N): the whole gradient's norm is then <= clip_norm
        total = self.total_numel or buf.numel()
        limit = self.config.clip_norm * math.sqrt(buf.numel() / total)
        norm = torch.linalg.vector_norm(buf, dtype=torch.float32)
        buf.mul_(torch.clamp(limit / (norm + 1e-6), max=1.0) * self.weight)

    def _account(self, bucket: dist.GradBucket, mode: str, sent: int, entries: int) -> None:
        n = bucket.buffer().numel()
        self._acc_sent += sent
        self._acc_recv += sent  # ring collectives receive what they send
        self._acc_entries += entries
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
            self.density = self._acc_entries / max(self._acc_numel, 1)
            self.last_modes = self._modes
            self._reset_step_stats()


def _nonfinite_marker(acc: torch.Tensor) -> torch.Tensor:
    """0-d fp32: NaN if acc holds a NaN/inf, else 0 (stays on device: no host sync)."""
    bad = ~torch.isfinite(acc).all()
    return torch.where(bad, torch.full((), float("nan"), device=acc.device), torch.zeros((), device=acc.device))


def _dense(state: CompressedState, bucket: dist.GradBucket, mode: str, send_nothing: bool):
    """Dense all-reduce; outside warm-up it adds gamma*residual and flushes the residual."""
    buf = bucket.buffer()
    policy = state.policies[state.rank]
    has_ef = mode != "warmup" and policy.tier_factor is not None
    state._scale(buf, clip=mode != "warmup")
    if not has_ef and not send_nothing:
        fut, sent = comm.all_reduce(buf, state.process_group)
        state._account(bucket, mode, sent, buf.numel())
        return fut.then(lambda f: f.value()[0] if isinstance(f.value(), list) else f.value())
    residual = state.memory.residual(bucket.index(), state.memory.keys(bucket), bucket.gradients())
    acc = ef_accumulate(buf, residual if has_ef else None, policy.gamma, state.config.compression_backend)
    marker = _nonfinite_marker(acc)
    if send_nothing:
        send, kept = torch.zeros_like(acc).add_(marker), acc
    else:
        send, kept = acc, torch.zeros_like(acc)
    if has_ef:
        residual.copy_(torch.where(torch.isnan(marker), residual, kept))
    fut, sent = comm.all_reduce(send, state.process_group)
    state._account(bucket, mode, sent, 0 if send_nothing else buf.numel())
    return fut.then(lambda _f: send.to(buf.dtype))


def topk_hook(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sample-weighted Top-K with error feedback (methods ``topk`` and ``tiered``).

    1. ``buffer *= b_r/G`` (after the optional clip); acc = buffer + gamma*residual;
    2. this rank's k from its tier and the cosine schedule; capacity = max k over ranks;
    3. values + int32 indices (+ a non-finite marker) padded to capacity, one all-gather;
    4. residual = acc minus the sent entries; result = sum of all ranks' sparse payloads.

    Example::

        state = CompressedState(method="tiered", tiers=["ib", "eth1g"])
        ddp_model.register_comm_hook(state, topk_hook)
    """
    step = state.step
    state.record_bucket(bucket)
    buf = bucket.buffer()  # (n,) flat view of the bucket's gradients
    mode, ks = state.plan(step, buf.numel())
    if mode != "sparse":
        return _dense(state, bucket, mode, send_nothing=mode == "dense" and ks[state.rank] == 0)
    k, capacity = ks[state.rank], max(ks)
    state._scale(buf, clip=True)
    residual = state.memory.residual(bucket.index(), state.memory.keys(bucket), bucket.gradients())
    policy = state.policies[state.rank]
    acc = ef_accumulate(buf, residual, policy.gamma, state.config.compression_backend)  # (n,) fp32
    marker = _nonfinite_marker(acc)
    payload, new_residual = TopKCodec.compress(acc, k, capacity, state.config.compression_backend)
    residual.copy_(torch.where(torch.isnan(marker), residual, new_residual))
    payload = torch.cat([payload, marker.reshape(1)])  # (2*capacity + 1,)
    fut, gathered, sent = comm.all_gather(payload, state.process_group)
    state._account(bucket, mode, sent, k)
    numel, dtype = buf.numel(), buf.dtype

    def decode(_f: torch.futures.Future) -> torch.Tensor:
        out = TopKCodec.decompress(gathered[:, :-1], numel)  # (n,) fp32
        return out.add_(gathered[:, -1].sum()).to(dtype)  # any rank's NaN marks the whole bucket

    return fut.then(decode)


def onebit_hook(state: CompressedState, bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """Sample-weighted 1-bit sign compression with error feedback (method ``onebit``).

    1. ``buffer *= b_r/G``; acc = buffer + gamma*residual;
    2. payload = packed signs of acc + scale = mean|acc|; residual = acc - scale*sign(acc);
    3. one all-gather; result = sum over ranks of scale_r * sign_r (NaN scale marks the bucket).

    Example::

        state = CompressedState(method="onebit")
        ddp_model.register_comm_hook(state, onebit_hook)
    """
    step = state.step
    state.record_bucket(bucket)
    buf = bucket.buffer()
    mode, _ = state.plan(step, buf.numel())
    if mode != "onebit":
        return _dense(state, bucket, mode, send_nothing=False)
    state._scale(buf, clip=True)
    residual = state.memory.residual(bucket.index(), state.memory.keys(bucket), bucket.gradients())
    acc = ef_accumulate(buf, residual, state.policies[state.rank].gamma, state.config.compression_backend)
    marker = _nonfinite_marker(acc)
    payload, new_residual = SignCodec.compress(acc.add(marker))  # NaN scale if non-finite
    residual.copy_(torch.where(torch.isnan(marker), residual, new_residual))
    fut, gathered, sent = comm.all_gather(payload, state.process_group)
    state._account(bucket, mode, sent, buf.numel())
    numel, dtype = buf.numel(), buf.dtype
    return fut.then(lambda _f: SignCodec.decompress(gathered, numel).to(dtype))
