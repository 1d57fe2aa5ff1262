"""``HeteroConfig``: all sections together, flat keyword routing, YAML in and out."""

from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from hetero_strategy.config.compression import CompressionConfig
from hetero_strategy.config.errors import CONFIG_ENV, ConfigError, _fail, _fail_rank_count, shown
from hetero_strategy.config.files import read_yaml, write_atomic
from hetero_strategy.config.hybrid import HybridConfig
from hetero_strategy.config.precision import PrecisionConfig
from hetero_strategy.config.reliability import ReliabilityConfig
from hetero_strategy.config.sections import BalanceConfig, CalibrationConfig

__all__ = ["HeteroConfig", "field_owners"]

# Section name -> (class, shorthand field): `compression="topk"` means CompressionConfig(method="topk").
_SECTIONS: dict[str, tuple[type, str | None]] = {
    "balance": (BalanceConfig, None),
    "calibration": (CalibrationConfig, "calibrate"),
    "compression": (CompressionConfig, "method"),
    "precision": (PrecisionConfig, None),
    "reliability": (ReliabilityConfig, None),
    # NOTE: no shorthand: `hybrid="hybrid"` reads badly; the flat key is `mode="hybrid"`
    "hybrid": (HybridConfig, None),
}


@dataclass(kw_only=True, slots=True)
class HeteroConfig:
    """All of hetero_strategy's settings, one section per component."""

    balance: BalanceConfig = field(default_factory=BalanceConfig)
    calibration: CalibrationConfig = field(default_factory=CalibrationConfig)
    compression: CompressionConfig = field(default_factory=CompressionConfig)
    precision: PrecisionConfig = field(default_factory=PrecisionConfig)
    reliability: ReliabilityConfig = field(default_factory=ReliabilityConfig)
    hybrid: HybridConfig = field(default_factory=HybridConfig)

    def __post_init__(self) -> None:
        for name, (cls, _) in _SECTIONS.items():
            value = getattr(self, name)
            if isinstance(value, dict):
                setattr(self, name, _build_section(name, cls, value))
            elif not isinstance(value, cls):
                _fail(name, value, f"must be a {cls.__name__} or a mapping of its fields")
        self._check_hybrid()

    def _check_hybrid(self) -> None:
        # NOTE: both run a collective every optimizer step, which ranks taking unequal numbers of
        # local steps would never all reach (a hang)
        if self.hybrid.mode != "hybrid":
            return
        if self.calibration.calibrate:
            _fail("calibrate", True, "online calibration all-gathers timings every step, which local-SGD phases "
                  "cannot do; use calibrate=False with mode='hybrid'")
        if self.precision.precision_policy is not None:
            _fail("precision_policy", self.precision.precision_policy, "coordinated loss scaling reduces every "
                  "step, which local-SGD phases cannot do; use precision_policy=None with mode='hybrid'")

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> HeteroConfig:
        """Build from a nested mapping (the YAML layout); unknown keys are refused."""
        if not isinstance(data, dict):
            _fail("config", data, "the top level must be a mapping of sections")
        unknown = sorted(set(data) - set(_SECTIONS), key=str)  # YAML keys may be numbers, dates, ...
        if unknown:
            _fail(_key(unknown[0]), data[unknown[0]], f"unknown section; known sections: {', '.join(_SECTIONS)}")
        # NOTE: only an empty section (`balance:`) means the defaults; `balance: 0` is refused
        return cls(**{k: _build_section(k, _SECTIONS[k][0], {} if v is None else v) for k, v in data.items()})

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
            if not os.path.isfile(config):  # NOTE: False, not OSError, for a name too long or with a NUL
                _fail("config", str(config), "no such file; write one with `hetero-strategy config` or "
                      "HeteroConfig.to_yaml")
            return cls.from_yaml(config).replace(**flat)
        if isinstance(config, HeteroConfig):
            return config.replace(**flat)
        _fail("config", config, "pass a HeteroConfig or the path of a YAML file")

    @classmethod
    def from_env(cls, config: str | Path | HeteroConfig | None, flat: dict[str, Any]) -> HeteroConfig:
        """:meth:`resolve`, where None means the YAML named by ``$HETERO_STRATEGY_CONFIG`` (the wizard's
        launch line sets it), else the defaults."""
        if config is None:
            config = os.environ.get(CONFIG_ENV) or None
            if config is not None and not os.path.isfile(config):
                _fail(CONFIG_ENV, config, "no such file; point it at a hetero YAML (`hetero-strategy config` "
                      "writes one) or unset it")
        return cls.resolve(config, flat)

    @staticmethod
    def source(config: str | Path | HeteroConfig | None, flat: dict[str, Any]) -> str:
        """Where :meth:`from_env`'s settings come from, in words (an adapter says it at start-up, so a
        keyword that overrides the wizard's file is not silent)."""
        named = os.environ.get(CONFIG_ENV) if config is None else None
        origin = (f"{config or named}" + (f" (${CONFIG_ENV})" if named else "") if isinstance(config, (str, Path))
                  or named else "a HeteroConfig" if config is not None else "the defaults")
        given = ", ".join(f"{k}={shown(v)}" for k, v in flat.items())
        return origin + (f", with {given} given as keywords on top" if given else "")

    @classmethod
    def from_keywords(cls, config: Any, named: dict[str, Any], kwargs: dict[str, Any]) -> HeteroConfig:
        """An adapter's constructor keywords: ``config`` with the HeteroConfig fields among ``named``
        (its own parameters, those set) and ``kwargs`` (popped from it) on top; ``compression`` is the
        section's shorthand. What stays in ``kwargs`` is the framework's."""
        owners = field_owners()
        flat = {k: v for k, v in named.items() if k in owners and v is not None}
        flat.update({k: kwargs.pop(k) for k in list(kwargs) if k in owners})
        compression = named.get("compression", kwargs.pop("compression", None))
        if compression is not None:
            flat["compression"] = compression
        return cls.resolve(config, flat)

    @classmethod
    def from_yaml(cls, path: str | Path) -> HeteroConfig:
        data = read_yaml(path)
        return cls.from_dict({} if data is None else data)

    @classmethod
    def problems(cls, data: Any) -> list[str]:
        """Every error of a nested mapping (the YAML layout, None for an empty file), one per
        section, then the checks across sections; [] when :meth:`from_dict` accepts it."""
        data = {} if data is None else data
        if not isinstance(data, dict):
            return [f"config={shown(data)} is invalid: the top level must be a mapping of sections"]
        out = []
        for key, value in data.items():
            try:
                cls.from_dict({key: value})
            except ConfigError as e:  # NOTE: to report every section's error, not only the first
                out.append(str(e))
        if not out:
            try:
                cls.from_dict(data)
            except ConfigError as e:
                out.append(str(e))
        return out

    def check_world_size(self, world_size: int) -> None:
        """Refuse per-rank lists of another length than the job's ranks (a profile's, or the launch's)."""
        self.balance.check_world_size(world_size)
        per_rank = {"tiers": self.compression.tiers, "precision_policy": self.precision.precision_policy}
        for name, values in per_rank.items():
            if isinstance(values, list) and len(values) != world_size:
                _fail_rank_count(name, values, world_size)
        groups = self.compression.fast_groups
        if groups is not None and sum(len(g) for g in groups) != world_size:
            _fail("fast_groups", groups, f"the groups must cover the job's {world_size} ranks exactly once")

    # ---- output -------------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {name: _as_dict(getattr(self, name)) for name in _SECTIONS}

    def to_record(self) -> dict[str, Any]:
        """:meth:`to_dict` with functions (``sample_cost=lambda i: ...``) named, not stored: for
        checkpoints and logs, which must pickle and load with ``weights_only``."""
        return {name: {k: f"<function {getattr(v, '__qualname__', repr(v))}>" if callable(v) else v
                       for k, v in section.items()} for name, section in self.to_dict().items()}

    def to_yaml(self, path: str | Path) -> None:
        if callable(self.balance.sample_cost):
            _fail("sample_cost", self.balance.sample_cost, "a YAML config can only name a dataset attribute, e.g. "
                  "sample_cost: lengths")
        write_atomic(path, yaml.safe_dump(self.to_dict(), sort_keys=False))


def field_owners() -> dict[str, str]:
    """Map each leaf field name to its section (names are unique across sections)."""
    owners: dict[str, str] = {}
    for section, (cls, _) in _SECTIONS.items():
        for f in dataclasses.fields(cls):
            owners[f.name] = section
    return owners


def _as_dict(section: Any) -> dict[str, Any]:
    return {f.name: getattr(section, f.name) for f in dataclasses.fields(section)}


def _key(key: Any) -> str:
    """A key as a message names it: plain names as they are, anything else ('', 1, 'a b') quoted."""
    return key if isinstance(key, str) and key.isidentifier() else shown(key)


def _build_section(name: str, cls: type, values: dict[str, Any]) -> Any:
    if not isinstance(values, dict):
        _fail(name, values, f"must be a mapping of {cls.__name__} fields")
    known = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - known, key=str)
    if unknown:
        _fail(f"{name}.{_key(unknown[0])}", values[unknown[0]],
              f"unknown key; known keys of {name}: {', '.join(sorted(known))}")
    return cls(**values)
