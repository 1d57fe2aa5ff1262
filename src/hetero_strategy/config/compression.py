"""The compression section: codec, density schedule, tiers, hierarchy (docs/compression.md)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hetero_strategy.config.errors import _fail, _number, _plain, _whole

__all__ = ["COMPRESSION_METHODS", "TIERS", "TIER_CODECS", "CompressionConfig"]

TIERS = ("nvlink", "ib", "eth10g", "eth1g")
# NOTE: new methods go last: the wizard lists them in this order, and scripted answers pick by position
COMPRESSION_METHODS = ("none", "topk", "tiered", "onebit", "fp16", "bf16", "powersgd", "topk_allreduce", "auto")
_TOPK = ("topk", "topk_allreduce", "tiered")  # the methods of the Top-K exchange
_TOPK_OR_AUTO = (*_TOPK, "auto")  # auto applies Top-K-only options when it picks a Top-K codec
# what one tier's exchange may run (tier_overrides.<tier>.codec): the slowest tier's decides
TIER_CODECS = ("dense", "fp16", "bf16", "topk", "topk_allreduce", "powersgd", "onebit")


@dataclass(kw_only=True, slots=True)
class CompressionConfig:
    """Gradient compression in the DDP comm hook (docs/design.md semantics 6-8); see docs/compression.md."""

    method: str = "none"
    """One of none, topk, topk_allreduce, tiered, onebit, fp16, bf16, powersgd, auto. topk_allreduce
    sends every rank's values at one agreed index set, summed by one all-reduce: its bytes per rank
    do not grow with the world size (topk's all-gather does). auto measures the link and each
    codec's cost on this model when the hook is built and picks the codec with its density or
    rank (docs/choosing-compression.md); the decision is logged and checkpointed."""
    base_density: float = 0.05
    """Fraction of gradient entries sent at the start of the cosine schedule (times the tier's factor)."""
    min_density: float | None = None
    """Floor of the density schedule; None is base_density / 10."""
    tier: str | None = None
    """This rank's link tier (nvlink, ib, eth10g, eth1g); None reads HETERO_TIER or measures."""
    tiers: list[str] | None = None
    """Per-rank link tiers (one per rank; overrides ``tier``), for one config shared by all ranks."""
    tier_profile: str | None = None
    """Path of a cluster profile JSON (``hetero-strategy profile``) whose per-rank tiers to use when
    neither tiers, tier nor HETERO_TIER name one."""
    tier_overrides: dict[str, dict[str, Any]] | None = None
    """Per-tier changes of the defaults, e.g. {"eth1g": {"tier_factor": 0.05, "exchange_every": 2,
    "gamma": 0.9}}; tier_factor None makes a tier dense. {"eth1g": {"codec": "powersgd", "rank": 4}}
    gives a tier its own codec (dense, fp16, bf16, topk, topk_allreduce, powersgd, onebit): one
    exchange runs the codec of its slowest tier on every rank."""
    dense_warmup_steps: int = 10
    """Dense (uncompressed) steps before the sparse schedule starts; at least 1, because DDP rebuilds
    its buckets after the first step and the hook learns the gradient layout there."""
    density_period: int | None = None
    """Steps T of the cosine decay; None takes the run's max_steps when known (Lightning's trainer, or
    HeteroPlugin.prepare(max_steps=...)), else 1000."""
    density_schedule: str = "cosine"
    """cosine (decay to min_density over density_period) or constant (base_density x tier_factor)."""
    density_warmup: str = "dense"
    """topk/topk_allreduce/tiered: dense (dense_warmup_steps dense steps) or exponential (DGC's
    warm-up: step 0 dense, then the density falls geometrically to the schedule's over
    dense_warmup_steps steps, e.g. 1, 0.32, 0.1, 0.032, 0.01 for base_density 0.01 and 4 steps).
    Measured, not a clear gain: steps to target 150 -> 160 (topk), 130 vs 140 beside
    momentum_correction (docs/compression.md, "Momentum correction"), so dense stays the default."""
    momentum_correction: float = 0.0
    """topk/topk_allreduce/tiered: DGC's momentum correction with this momentum factor (e.g. 0.9;
    0 is off). The hook keeps each rank's velocity u = m*u + g and sends the Top-K of velocity +
    residual, so the optimizer must run WITHOUT momentum (SGD(momentum=0)), or momentum is applied
    twice; the runtime warns when it sees one with momentum. Velocities are checkpointed. Measured
    with masking: steps to target 150 -> 140 (topk), a miss -> 210 (topk_allreduce); off by default
    only because turning it on needs that optimizer change."""
    momentum_masking: bool = True
    """With momentum_correction: zero the velocity where a sparse entry was sent (DGC's
    momentum-factor masking). Without it topk_allreduce missed the target (accuracy 0.878)."""
    ef_gamma: float = 1.0
    """Error-feedback strength for topk and onebit (tiered takes each tier's gamma)."""
    dense_sync_every: int = 100
    """Every N steps exchange dense full-precision gradients and flush residuals; 0 disables."""
    clip_norm: float | None = None
    """Clip each rank's gradient to this global L2 norm before compression (None: no clipping)."""
    compression_backend: str = "auto"
    """Top-K kernels: auto (Triton on GPU when available, else torch), triton, or torch."""
    dense_fallback: bool = True
    """topk/tiered: measure the link and the codec when the hook is built, and send a parameter
    densely where compressing it would take longer than sending it (a fast link; metric
    comm/dense_fallback). False compresses whatever the link."""
    pipeline_stages: int | str = "auto"
    """topk/tiered: cut each bucket into this many chunks of whole parameters (1-8) and start each
    chunk's exchange as soon as it is encoded, so the codec overlaps the communication; "auto"
    takes ceil(T_codec / T_comm) + 1 from the dense_fallback measurement (1 without it)."""
    side_streams: bool = False
    """topk/tiered/onebit on CUDA: run each bucket's codec, collectives' issue and decode on a side
    stream, ordered by events, so they overlap the rest of backward. Off until checked on a GPU
    (benchmarks/gpu_check.py); nothing changes on the CPU."""
    powersgd_rank: int = 4
    """Matrix approximation rank of the PowerSGD baseline (compression="powersgd")."""
    overlap_comm: bool = True
    """compression="none": overlap each bucket's all-reduce with the rest of backward (DDP's way).
    False sends all buckets once backward ends: for ranks whose communication competes with
    backward for the same compute (gloo with one CPU core per rank)."""
    selection: str = "exact"
    """topk/tiered: how each parameter's entries are picked. exact: its top-k every step (a radix
    select or sampled sort). threshold: Ok-Topk's threshold reuse, every entry above a threshold
    estimated as the exact k-th magnitude once per threshold_every compressed steps, one streaming
    pass in between; how many go then follows the gradient (metric comm/entries_sent)."""
    threshold_every: int = 10
    """selection="threshold": re-estimate each parameter's threshold every N of its compressed steps
    (and at once when its k moved by more than an eighth); 1 re-estimates every step."""
    threshold_headroom: float = 1.25
    """selection="threshold": payload slots per planned entry (k), 1-4, so a threshold that lets more
    than k through still sends them; entries beyond the slots stay in the residual. Wire bytes grow
    by this factor over exact selection."""
    hierarchical: bool = False
    """topk/tiered: dense all-reduce inside each fast group (node), compressed exchange between the
    groups' leaders, then a broadcast inside each group."""
    fast_groups: list[list[int]] | None = None
    """Ranks joined by fast links, e.g. [[0, 1], [2, 3]]; None groups ranks by host (and network
    namespace). Used when hierarchical is true."""

    def __post_init__(self) -> None:
        if self.method not in COMPRESSION_METHODS:
            _fail("compression", self.method, f"choose one of {', '.join(COMPRESSION_METHODS)}")
        for name in ("base_density", "min_density"):
            v = getattr(self, name)
            if name == "min_density" and v is None:
                continue
            if not _number(v) or not 0.0 < v <= 1.0:
                _fail(name, v, "a density must lie in (0, 1]")
        if self.min_density is not None and self.min_density > self.base_density:
            _fail("min_density", self.min_density,
                  f"must not exceed base_density={self.base_density}; lower min_density")
        if self.tier is not None and self.tier not in TIERS:
            _fail("tier", self.tier, f"choose one of {', '.join(TIERS)}")
        if self.tiers is not None:
            if not isinstance(self.tiers, (list, tuple)) or not self.tiers:
                _fail("tiers", self.tiers, "give a non-empty list with one tier per rank")
            for i, t in enumerate(self.tiers):
                if t not in TIERS:
                    _fail(f"tiers[{i}]", t, f"choose one of {', '.join(TIERS)}")
        if self.tier_profile is not None and not isinstance(self.tier_profile, (str, Path)):
            _fail("tier_profile", self.tier_profile, "give the path of a cluster profile JSON, or None")
        self._check_tier_overrides()
        self._check_int("dense_warmup_steps", self.dense_warmup_steps, 1,
                        "DDP rebuilds its buckets after step 1, so at least the first step is dense")
        if self.density_period is not None:
            self._check_int("density_period", self.density_period, 1, "or None to use the run's max_steps")
        if self.density_schedule not in ("cosine", "constant"):
            _fail("density_schedule", self.density_schedule, "choose cosine or constant")
        self._check_dgc()
        if not _number(self.ef_gamma) or not 0 < self.ef_gamma <= 1:
            _fail("ef_gamma", self.ef_gamma, "must lie in (0, 1]; 1.0 is classic error feedback")
        self._check_int("dense_sync_every", self.dense_sync_every, 0, "0 disables the periodic dense sync")
        if self.clip_norm is not None and (
            not _number(self.clip_norm) or not self.clip_norm > 0
        ):
            _fail("clip_norm", self.clip_norm, "must be a positive number (e.g. 5.0) or None")
        if self.compression_backend not in ("auto", "triton", "torch"):
            _fail("compression_backend", self.compression_backend, "choose auto, triton or torch")
        if not isinstance(self.dense_fallback, bool):
            _fail("dense_fallback", self.dense_fallback, "must be true or false")
        if self.pipeline_stages != "auto" and (isinstance(self.pipeline_stages, bool) or not isinstance(
                self.pipeline_stages, int) or not 1 <= self.pipeline_stages <= 8):
            _fail("pipeline_stages", self.pipeline_stages, "use auto or an integer from 1 (no pipelining) to 8")
        if self.pipeline_stages != "auto" and self.method not in _TOPK_OR_AUTO:
            _fail("pipeline_stages", self.pipeline_stages, f"stages chunk the Top-K exchange of {', '.join(_TOPK)}, "
                  f"not compression={self.method!r}; drop pipeline_stages")
        if not isinstance(self.side_streams, bool):
            _fail("side_streams", self.side_streams, "must be true or false")
        if self.side_streams and self.method not in (*_TOPK_OR_AUTO, "onebit"):
            _fail("side_streams", self.side_streams,
                  f"side streams run the codec of {', '.join(_TOPK)} or onebit, not compression={self.method!r}")
        self._check_int("powersgd_rank", self.powersgd_rank, 1, "PowerSGD needs a rank of at least 1 (e.g. 4)")
        if not isinstance(self.overlap_comm, bool):
            _fail("overlap_comm", self.overlap_comm, "must be true or false")
        if not self.overlap_comm and self.method != "none":
            _fail("overlap_comm", self.overlap_comm,
                  f"deferring communication is only offered for compression='none', not {self.method!r}")
        self._check_selection()
        if not isinstance(self.hierarchical, bool):
            _fail("hierarchical", self.hierarchical, "must be true or false")
        if self.hierarchical and self.method not in _TOPK_OR_AUTO:
            _fail("hierarchical", self.hierarchical,
                  f"works with compression={' or '.join(map(repr, _TOPK_OR_AUTO))} only")
        self._check_fast_groups()
        _plain(self)

    def _check_dgc(self) -> None:
        """The DGC options (Lin et al., ICLR 2018) act on the Top-K exchange of the DDP hooks only."""
        if self.density_warmup not in ("dense", "exponential"):
            _fail("density_warmup", self.density_warmup, "choose dense or exponential")
        if self.density_warmup == "exponential" and self.method not in _TOPK:
            _fail("density_warmup", self.density_warmup,
                  f"the exponential warm-up ramps the Top-K density of {', '.join(_TOPK)}, not compression="
                  f"{self.method!r}; use density_warmup='dense'")
        m = self.momentum_correction
        if not _number(m) or not 0.0 <= m < 1.0:
            _fail("momentum_correction", m, "the momentum factor must lie in [0, 1), e.g. 0.9; 0 turns it off")
        if m and self.method not in _TOPK:
            _fail("momentum_correction", m, f"it corrects the Top-K exchange of {', '.join(_TOPK)}, not "
                  f"compression={self.method!r}; set momentum_correction=0")
        if m and self.hierarchical:
            _fail("momentum_correction", m, "not supported with hierarchical=True (a leader would keep "
                  "its group's velocity, not its own); set hierarchical=False or momentum_correction=0")
        if not isinstance(self.momentum_masking, bool):
            _fail("momentum_masking", self.momentum_masking, "must be true or false")

    @property
    def density_floor(self) -> float:
        """The schedule's floor: min_density, or base_density / 10 when it is None."""
        return self.base_density / 10 if self.min_density is None else self.min_density

    def _check_selection(self) -> None:
        if self.selection not in ("exact", "threshold"):
            _fail("selection", self.selection, "choose exact (top-k every step) or threshold (reused threshold)")
        self._check_int("threshold_every", self.threshold_every, 1, "the steps between re-estimates; 1 is every step")
        h = self.threshold_headroom
        if not _number(h) or not 1.0 <= h <= 4.0:
            _fail("threshold_headroom", h, "payload slots per planned entry must lie in [1, 4], e.g. 1.25")
        if self.selection == "exact":
            return
        codecs = {v.get("codec") for v in (self.tier_overrides or {}).values() if isinstance(v, dict)}
        if self.method not in ("topk", "tiered") or "topk_allreduce" in codecs:
            _fail("selection", self.selection, f"threshold reuse picks each rank's own entries for the all-gather "
                  f"of compression='topk' or 'tiered' (no topk_allreduce codec), not {self.method!r}; "
                  "use selection='exact'")

    def _check_fast_groups(self) -> None:
        groups = self.fast_groups
        if groups is None:
            return
        seen: set[int] = set()
        if not isinstance(groups, (list, tuple)) or not groups:
            _fail("fast_groups", groups, "give a list of rank lists, e.g. [[0, 1], [2, 3]]")
        for i, g in enumerate(groups):
            if not isinstance(g, (list, tuple)) or not g:
                _fail(f"fast_groups[{i}]", g, "each group is a non-empty list of ranks")
            for r in g:
                if not _whole(r) or r < 0 or r in seen:
                    _fail(f"fast_groups[{i}]", g, "ranks must be distinct integers >= 0, each in one group")
                seen.add(r)
        if seen != set(range(len(seen))):
            _fail("fast_groups", groups, f"the groups must cover ranks 0..{len(seen) - 1} exactly once")

    @staticmethod
    def _check_int(name: str, value: Any, low: int, why: str) -> None:
        if not _whole(value) or value < low:
            _fail(name, value, f"must be an integer >= {low}; {why}")

    def _check_tier_overrides(self) -> None:
        if self.tier_overrides is None:
            return
        if not isinstance(self.tier_overrides, dict):
            _fail("tier_overrides", self.tier_overrides, "give a mapping tier -> {tier_factor, exchange_every, gamma}")
        for tier, values in self.tier_overrides.items():
            if tier not in TIERS:
                _fail("tier_overrides", tier, f"unknown tier; choose among {', '.join(TIERS)}")
            if not isinstance(values, dict):
                _fail(f"tier_overrides.{tier}", values, "give a mapping of tier_factor, exchange_every, gamma")
            for key, v in values.items():
                where = f"tier_overrides.{tier}.{key}"
                if key == "tier_factor":
                    if v is not None and (not _number(v) or not 0 < v <= 1):
                        _fail(where, v, "must lie in (0, 1], or None for a dense tier")
                elif key == "exchange_every":
                    self._check_int(where, v, 1, "1 exchanges every step")
                elif key == "gamma":
                    if not _number(v) or not 0 < v <= 1:
                        _fail(where, v, "must lie in (0, 1]")
                elif key == "codec":
                    if v not in TIER_CODECS:
                        _fail(where, v, f"choose one of {', '.join(TIER_CODECS)}")
                    if self.method != "tiered":
                        _fail(where, v, f"a tier's codec applies to compression='tiered', not {self.method!r}"
                              + ("; auto chooses the codec itself: drop the codec" if self.method == "auto" else ""))
                elif key == "rank":
                    self._check_int(where, v, 1, "PowerSGD's approximation rank, e.g. 4")
                else:
                    _fail(where, v, "unknown key; use tier_factor, exchange_every, gamma, codec or rank")
