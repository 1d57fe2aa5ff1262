"""Validated configuration for hetero_strategy.

Every section is a small ``@dataclass(kw_only=True, slots=True)`` whose ``__post_init__`` refuses
bad values with the field, the value and the fix. ``HeteroConfig`` groups the sections and reads
and writes YAML; unknown keys are refused with the key named.

Example::

    cfg = HeteroConfig.from_flat(batch_sizes=[3, 13], compression="topk")
    cfg.to_yaml("hetero.yaml")
    assert HeteroConfig.from_yaml("hetero.yaml") == cfg
"""

from hetero_strategy.config.compression import COMPRESSION_METHODS, TIERS, CompressionConfig
from hetero_strategy.config.errors import CONFIG_ENV, ConfigError, counted
from hetero_strategy.config.hetero import HeteroConfig, field_owners
from hetero_strategy.config.hybrid import HYBRID_MODES, HybridConfig
from hetero_strategy.config.precision import DTYPE_NAMES, PrecisionConfig
from hetero_strategy.config.reliability import NONFINITE_ACTIONS, ReliabilityConfig
from hetero_strategy.config.sections import BalanceConfig, CalibrationConfig

__all__ = [
    "COMPRESSION_METHODS",
    "CONFIG_ENV",
    "DTYPE_NAMES",
    "HYBRID_MODES",
    "NONFINITE_ACTIONS",
    "TIERS",
    "BalanceConfig",
    "CalibrationConfig",
    "CompressionConfig",
    "ConfigError",
    "HeteroConfig",
    "HybridConfig",
    "PrecisionConfig",
    "ReliabilityConfig",
    "counted",
    "field_owners",
]
