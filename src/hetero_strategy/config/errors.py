"""The error every config check raises, and the helpers that word it (field, value, fix).

The helpers are the one place each shared concept is checked: what counts as a number (finite,
not a bool), a whole number, and how a refused value is shown (shortened: a 100,000-entry list
or a YAML alias bomb must not become the message).
"""

from __future__ import annotations

import dataclasses
import math
import reprlib
from pathlib import PurePath
from typing import Any

__all__ = ["CONFIG_ENV", "ConfigError", "counted", "refuse_unknown_keywords", "shown"]

CONFIG_ENV = "HETERO_STRATEGY_CONFIG"
"""Environment variable naming a hetero YAML file (``hetero-strategy config`` writes one)."""

_REPR = reprlib.Repr()
_REPR.maxstring, _REPR.maxother, _REPR.maxlevel = 160, 80, 3
_REPR.maxlist = _REPR.maxtuple = _REPR.maxdict = _REPR.maxset = 8


class ConfigError(ValueError):
    """A configuration value was refused; the message names the field, the value and the fix."""


def shown(value: Any) -> str:
    """``repr(value)``, shortened to a few hundred characters however large or deep the value."""
    return _REPR.repr(value)


def counted(n: int, noun: str, plural: str | None = None) -> str:
    """``n`` with its noun in the right number: ``counted(1, "entry", "entries")`` -> "1 entry"."""
    return f"{n} {noun if n == 1 else plural or noun + 's'}"


def refuse_unknown_keywords(kwargs: dict[str, Any], targets: tuple[Any, ...], takes: str) -> None:
    """Refuse a keyword that none of ``targets`` (the constructors the rest is passed to) takes, here
    rather than deep inside one of them; ``takes`` says what the caller accepts."""
    import inspect

    known = set().union(*(inspect.signature(t).parameters for t in targets)) - {"self", "module", "kwargs"}
    for key, value in kwargs.items():
        if key not in known:
            raise ConfigError(f"{key}={shown(value)} is invalid: unknown option; {takes}")


def _fail(field_name: str, value: Any, fix: str) -> None:
    raise ConfigError(f"{field_name}={shown(value)} is invalid: {fix}")


def _fail_rank_count(field_name: str, values: list, world_size: int) -> None:
    """Refuse a per-rank list whose length is not the job's rank count."""
    _fail(field_name, values, f"has {counted(len(values), 'entry', 'entries')} but the job has "
          f"{counted(world_size, 'rank')}; give exactly {counted(world_size, 'entry', 'entries')}")


def _number(v: Any) -> bool:
    """A finite int or float, not a bool (NaN passes no bound check: ``nan < 1`` is false too)."""
    if isinstance(v, bool) or not isinstance(v, (int, float)):
        return False
    try:
        return math.isfinite(v)
    except OverflowError:  # an int beyond any float
        return False


def _whole(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _plain(section: Any) -> None:
    """After a section's checks: tuples become lists and paths strings, so what was accepted is
    what YAML writes and reads back (``batch_sizes=(3, 13)`` equals ``[3, 13]`` from a file)."""
    def plain(v: Any) -> Any:
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        return str(v) if isinstance(v, PurePath) else v

    for f in dataclasses.fields(section):
        value = getattr(section, f.name)
        if isinstance(value, (list, tuple, dict, PurePath)):
            setattr(section, f.name, plain(value))


def _check_positive_list(name: str, values: list | None, *, integer: bool) -> None:
    if values is None:
        return
    if not isinstance(values, (list, tuple)) or len(values) == 0:
        _fail(name, values, "give a non-empty list with one entry per rank")
    for i, v in enumerate(values):
        ok_type = _whole(v) if integer else _number(v)
        if not ok_type or not v > 0:
            kind = "a positive integer" if integer else "a positive finite number"
            _fail(f"{name}[{i}]", v, f"every entry must be {kind} (one per rank)")
