"""Validated configuration for hetero_strategy.

Every section is a small ``@dataclass(kw_only=True, slots=True)`` whose ``__post_init__`` refuses
bad values with the field, the value and the fix. ``HeteroConfig`` groups the sections and reads
and writes YAML; unknown keys are refused with the key named.

Example::

    cfg = HeteroConfig.from_flat(batch_sizes=[3, 13], compression="topk")
    cfg.to_yaml("hetero.yaml")
    assert HeteroConfig.from_yaml("hetero.yaml") == cfg
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

__all__ = [
    "COMPRESSION_METHODS",
    "CONFIG_ENV",
    "TIERS",
    "BalanceConfig",
    "CalibrationConfig",
    "CompressionConfig",
    "ConfigError",
    "HeteroConfig",
]


CONFIG_ENV = "HETERO_STRATEGY_CONFIG"
"""Environment variable naming a hetero YAML file (``hetero-strategy config`` writes one)."""


class ConfigError(ValueError):
    """A configuration value was refused; the message names the field, the value and the fix."""


def _fail(field_name: str, value: Any, fix: str) -> None:
    raise ConfigError(f"{field_name}={value!r} is invalid: {fix}")


def _check_positive_list(name: str, values: list | None, *, integer: bool) -> None:
    if values is None:
        return
    if not isinstance(values, (list, tuple)) or len(values) == 0:
        _fail(name, values, "give a non-empty list with one entry per rank")
    for i, v in enumerate(values):
        ok_type = isinstance(v, int) if integer else isinstance(v, (int, float))
        if isinstance(v, bool) or not ok_type or not v > 0:
            kind = "a positive integer" if integer else "a positive number"
            _fail(f"{name}[{i}]", v, f"every entry must be {kind} (one per rank)")


@dataclass(kw_only=True, slots=True)
class BalanceConfig:
    """How the global batch is split across ranks (DESIGN.md semantics 1-4)."""

    batch_sizes: list[int] | None = None
    """Explicit per-rank batch sizes; their sum must equal dataloader batch_size x world_size."""
    capacities: list[float] | None = None
    """Relative per-rank capacities; batch shares are proportional to them."""
    alpha: float = 0.7
    """Weight of measured compute speed in capacity = alpha*compute + beta*bandwidth."""
    beta: float = 0.3
    """Weight of measured link bandwidth in the capacity model."""
    max_batch_sizes: list[int] | None = None
    """Optional per-rank memory cap on the batch size (samples)."""
    probe_steps: int = 5
    """Timed forward+backward passes per rank for the automatic probe (when neither batch_sizes
    nor capacities are given)."""
    seed: int | None = None
    """Shuffle seed of the training sampler; None takes PL_GLOBAL_SEED (as Lightning does) or 0."""
    profile: str | None = None
    """A cluster-profile JSON (``hetero-strategy profile --json``): its per-rank link bandwidth is
    the beta term of the capacity model; compute is still probed on the real model."""

    def __post_init__(self) -> None:
        _check_positive_list("batch_sizes", self.batch_sizes, integer=True)
        _check_positive_list("capacities", self.capacities, integer=False)
        _check_positive_list("max_batch_sizes", self.max_batch_sizes, integer=True)
        if self.batch_sizes is not None and self.capacities is not None:
            _fail("capacities", self.capacities, "give either batch_sizes or capacities, not both")
        for name in ("alpha", "beta"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 <= v <= 1.0:
                _fail(name, v, "must lie in [0, 1] (defaults alpha=0.7, beta=0.3)")
        if self.alpha == 0 and self.beta == 0:
            _fail("alpha", self.alpha, "alpha and beta cannot both be 0; use the defaults 0.7 and 0.3")
        if isinstance(self.probe_steps, bool) or not isinstance(self.probe_steps, int) or self.probe_steps < 1:
            _fail("probe_steps", self.probe_steps, "must be an integer >= 1")
        if self.seed is not None and (isinstance(self.seed, bool) or not isinstance(self.seed, int)):
            _fail("seed", self.seed, "must be an integer or None")
        if self.profile is not None and not Path(self.profile).is_file():
            _fail("profile", self.profile, "no such file; write one with `hetero-strategy profile --json PATH`")

    def check_world_size(self, world_size: int, global_batch: int | None = None) -> None:
        """Refuse per-rank lists that do not match the job (called once the world size is known)."""
        for name in ("batch_sizes", "capacities", "max_batch_sizes"):
            values = getattr(self, name)
            if values is not None and len(values) != world_size:
                _fail(name, values, f"has {len(values)} entries but the job has {world_size} ranks; "
                      f"give exactly {world_size} entries")
        if global_batch is None:
            return
        if global_batch < world_size:
            _fail("batch_size", global_batch // max(world_size, 1),
                  f"the global batch {global_batch} is smaller than the world size {world_size}; "
                  "every rank needs at least one sample")
        if self.batch_sizes is not None and sum(self.batch_sizes) != global_batch:
            _fail("batch_sizes", self.batch_sizes,
                  f"they sum to {sum(self.batch_sizes)} but dataloader batch_size x world_size = "
                  f"{global_batch}; make them sum to {global_batch}")
        if self.max_batch_sizes is not None and sum(self.max_batch_sizes) < global_batch:
            _fail("max_batch_sizes", self.max_batch_sizes,
                  f"they allow only {sum(self.max_batch_sizes)} samples per step but the global "
                  f"batch is {global_batch}; raise the caps or lower the batch size")


@dataclass(kw_only=True, slots=True)
class CalibrationConfig:
    """Online rebalancing of batch shares (DESIGN.md semantics 5)."""

    calibrate: bool = False
    """Move batch shares toward equal per-rank finishing times while training."""
    cold_start_steps: int = 10
    """Steps run on the static plan before any timing is trusted."""
    recalibrate_every: int = 50
    """Steps between two rebalancing decisions."""
    window: int = 50
    """Number of recent steps whose timings a decision uses (20-100)."""
    max_change: float = 0.15
    """Largest relative change of one rank's share in one decision."""

    def __post_init__(self) -> None:
        for name in ("cold_start_steps", "recalibrate_every", "window"):
            v = getattr(self, name)
            if isinstance(v, bool) or not isinstance(v, int) or v < (0 if name == "cold_start_steps" else 1):
                _fail(name, v, "must be a positive integer")
        if not 20 <= self.window <= 100:
            _fail("window", self.window, "use a window of 20 to 100 steps")
        if not 0.0 < self.max_change <= 1.0:
            _fail("max_change", self.max_change, "must lie in (0, 1]; the default is 0.15")


TIERS = ("nvlink", "ib", "eth10g", "eth1g")
COMPRESSION_METHODS = ("none", "topk", "tiered", "onebit", "fp16", "bf16", "powersgd")


@dataclass(kw_only=True, slots=True)
class CompressionConfig:
    """Gradient compression in the DDP comm hook (DESIGN.md semantics 6-8); see docs/compression.md."""

    method: str = "none"
    """One of none, topk, tiered, onebit, fp16, bf16, powersgd."""
    base_density: float = 0.01
    """Fraction of gradient entries sent at the start of the cosine schedule."""
    min_density: float = 0.001
    """Floor of the density schedule."""
    tier: str | None = None
    """This rank's link tier (nvlink, ib, eth10g, eth1g); None reads HETERO_TIER or measures."""
    tiers: list[str] | None = None
    """Per-rank link tiers (one per rank; overrides ``tier``), for one config shared by all ranks."""
    tier_profile: str | None = None
    """Path of a cluster profile JSON (``hetero-strategy profile``) whose per-rank tiers to use when
    neither tiers, tier nor HETERO_TIER name one."""
    tier_overrides: dict[str, dict[str, Any]] | None = None
    """Per-tier changes of the defaults, e.g. {"eth1g": {"tier_factor": 0.05, "exchange_every": 2,
    "gamma": 0.9}}; tier_factor None makes a tier dense."""
    dense_warmup_steps: int = 10
    """Dense (uncompressed) steps before the sparse schedule starts; at least 1, because DDP rebuilds
    its buckets after the first step and the hook learns the gradient layout there."""
    density_period: int | None = None
    """Steps T of the cosine decay; None takes the run's max_steps when known (Lightning's trainer, or
    HeteroPlugin.prepare(max_steps=...)), else 1000."""
    density_schedule: str = "cosine"
    """cosine (decay to min_density over density_period) or constant (base_density x tier_factor)."""
    ef_gamma: float = 1.0
    """Error-feedback strength for topk and onebit (tiered takes each tier's gamma)."""
    dense_sync_every: int = 100
    """Every N steps exchange dense full-precision gradients and flush residuals; 0 disables."""
    clip_norm: float | None = None
    """Clip each rank's gradient to this global L2 norm before compression (None: no clipping)."""
    compression_backend: str = "auto"
    """Top-K kernels: auto (Triton on GPU when available, else torch), triton, or torch."""
    powersgd_rank: int = 4
    """Matrix approximation rank of the PowerSGD baseline (compression="powersgd")."""
    overlap_comm: bool = True
    """compression="none": overlap each bucket's all-reduce with the rest of backward (DDP's way).
    False sends all buckets once backward ends: for ranks whose communication competes with
    backward for the same compute (gloo with one CPU core per rank)."""
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
            if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0.0 < v <= 1.0:
                _fail(name, v, "a density must lie in (0, 1]")
        if self.min_density > self.base_density:
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
        if isinstance(self.ef_gamma, bool) or not isinstance(self.ef_gamma, (int, float)) or not 0 < self.ef_gamma <= 1:
            _fail("ef_gamma", self.ef_gamma, "must lie in (0, 1]; 1.0 is classic error feedback")
        self._check_int("dense_sync_every", self.dense_sync_every, 0, "0 disables the periodic dense sync")
        if self.clip_norm is not None and (
            isinstance(self.clip_norm, bool) or not isinstance(self.clip_norm, (int, float)) or not self.clip_norm > 0
        ):
            _fail("clip_norm", self.clip_norm, "must be a positive number (e.g. 5.0) or None")
        if self.compression_backend not in ("auto", "triton", "torch"):
            _fail("compression_backend", self.compression_backend, "choose auto, triton or torch")
        self._check_int("powersgd_rank", self.powersgd_rank, 1, "PowerSGD needs a rank of at least 1 (e.g. 4)")
        if not isinstance(self.overlap_comm, bool):
            _fail("overlap_comm", self.overlap_comm, "must be true or false")
        if not self.overlap_comm and self.method != "none":
            _fail("overlap_comm", self.overlap_comm,
                  f"deferring communication is only offered for compression='none', not {self.method!r}")
        if not isinstance(self.hierarchical, bool):
            _fail("hierarchical", self.hierarchical, "must be true or false")
        if self.hierarchical and self.method not in ("topk", "tiered"):
            _fail("hierarchical", self.hierarchical, "works with compression='topk' or 'tiered' only")
        self._check_fast_groups()

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
                if isinstance(r, bool) or not isinstance(r, int) or r < 0 or r in seen:
                    _fail(f"fast_groups[{i}]", g, "ranks must be distinct integers >= 0, each in one group")
                seen.add(r)
        if seen != set(range(len(seen))):
            _fail("fast_groups", groups, f"the groups must cover ranks 0..{len(seen) - 1} exactly once")

    @staticmethod
    def _check_int(name: str, value: Any, low: int, why: str) -> None:
        if isinstance(value, bool) or not isinstance(value, int) or value < low:
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
                    if v is not None and (isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1):
                        _fail(where, v, "must lie in (0, 1], or None for a dense tier")
                elif key == "exchange_every":
                    self._check_int(where, v, 1, "1 exchanges every step")
                elif key == "gamma":
                    if isinstance(v, bool) or not isinstance(v, (int, float)) or not 0 < v <= 1:
                        _fail(where, v, "must lie in (0, 1]")
                else:
                    _fail(where, v, "unknown key; use tier_factor, exchange_every or gamma")


# Section name -> (class, shorthand field): `compression="topk"` means CompressionConfig(method="topk").
_SECTIONS: dict[str, tuple[type, str | None]] = {
    "balance": (BalanceConfig, None),
    "calibration": (CalibrationConfig, "calibrate"),
    "compression": (CompressionConfig, "method"),
}


@dataclass(kw_only=True, slots=True)
class HeteroConfig:
    """All of hetero_strategy's settings, one section per component."""

    balance: BalanceConfig = field(default_factory=BalanceConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)

    def __post_init__(self) -> None:
        for name, (cls, _) in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, _build_section(name, cls, value))
            elif not isinstance(value, cls):
                _fail(name, value, f"must be a {cls.__name__} or a mapping of its fields")

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeteroConfig:
        """Build from a nested mapping (the YAML layout); unknown keys are refused."""
        if not isinstance(data, dict):
            _fail("config", data, "the top level must be a mapping of sections")
        unknown = sorted(set(data) - set(_SECTIONS))
        if unknown:
            _fail(unknown[0], data[unknown[0]], f"unknown section; known sections: {', '.join(_SECTIONS)}")
        return cls(**{k: _build_section(k, _SECTIONS[k][0], v or {}) for k, v in data.items()})

    @classmethod
    def from_flat(cls, **kwargs: Any) -> HeteroConfig:
        """Build from flat keyword arguments, as ``HeteroStrategy(**kwargs)`` takes them.

        A key is either a section name (with a mapping, a section object, or its shorthand value,
        e.g. ``compression="topk"``) or the name of a field inside a section (``batch_sizes=...``).
        """
        return cls().replace(**kwargs)

    def replace(self, **kwargs: Any) -> HeteroConfig:
        """A copy with the flat keyword arguments (see :meth:`from_flat`) applied on top."""
        sections = self.to_dict()
        owners = field_owners()
        for key, value in kwargs.items():
            if key in _SECTIONS:
                section_cls, shorthand = _SECTIONS[key]
                if isinstance(value, section_cls):
                    sections[key] = _as_dict(value)
                elif isinstance(value, dict):
                    sections[key].update(value)
                elif shorthand is not None:
                    sections[key][shorthand] = value
                else:
                    _fail(key, value, f"pass a mapping of {section_cls.__name__} fields")
            elif key in owners:
                sections[owners[key]][key] = value
            else:
                _fail(key, value, "unknown option; see HeteroConfig for the known fields")
        return HeteroConfig.from_dict(sections)

    @classmethod
    def resolve(cls, config: str | Path | HeteroConfig | None, flat: dict[str, Any]) -> HeteroConfig:
        """What an adapter was given: a config object or YAML path (or None), plus flat overrides."""
        if config is None:
            return cls.from_flat(**flat)
        if isinstance(config, (str, Path)):
            if not Path(config).is_file():
                _fail("config", str(config), "no such file; write one with `hetero-strategy config` or "
                      "HeteroConfig.to_yaml")
            return cls.from_yaml(config).replace(**flat)
        if isinstance(config, HeteroConfig):
            return config.replace(**flat)
        _fail("config", config, "pass a HeteroConfig or the path of a YAML file")

    @classmethod
    def from_yaml(cls, path: str | Path) -> HeteroConfig:
        with open(path) as f:
            return cls.from_dict(yaml.safe_load(f) or {})

    # ---- output -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {name: _as_dict(getattr(self, name)) for name in _SECTIONS}

    def to_yaml(self, path: str | Path) -> None:
        Path(path).write_text(yaml.safe_dump(self.to_dict(), sort_keys=False))


def field_owners() -> dict[str, str]:
    """Map each leaf field name to its section (names are unique across sections)."""
    owners: dict[str, str] = {}
    for section, (cls, _) in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            owners[f.name] = section
    return owners


def _as_dict(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def _build_section(name: str, cls: type, values: dict[str, Any]) -> Any:
    if not isinstance(values, dict):
        _fail(name, values, f"must be a mapping of {cls.__name__} fields")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known)
    if unknown:
        _fail(f"{name}.{unknown[0]}", values[unknown[0]],
              f"unknown key; known keys of {name}: {', '.join(sorted(known))}")
    return cls(**values)
