"""The error every config check raises, and the helpers that word it (field, value, fix)."""

from __future__ import annotations

from typing import Any

__all__ = ["CONFIG_ENV", "ConfigError"]

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
