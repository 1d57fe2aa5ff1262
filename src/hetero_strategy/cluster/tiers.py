"""Link tiers (docs/design.md semantics 8) from a measured or configured bandwidth.

Thresholds follow what each link class delivers in practice (bus bandwidth of an all-reduce,
or point-to-point throughput), with room below the nominal rate:

| tier   | measured bandwidth                 | typical link          |
|--------|------------------------------------|-----------------------|
| nvlink | > 200 Gbit/s, or same-host NVLink  | NVLink / NVSwitch     |
| ib     | >= 100 Gbit/s                      | InfiniBand, RoCE      |
| eth10g | >= 5 Gbit/s                        | 10/25 GbE             |
| eth1g  | below                              | 1 GbE and slower      |

Example::

    >>> classify_tier(9.4)
    'eth10g'
    >>> classify_tier(0.1)
    'eth1g'
"""

from __future__ import annotations

import math

__all__ = ["TIER_THRESHOLDS_GBIT", "classify_tier", "parse_rate", "parse_size"]

# Lower bound (Gbit/s) of each tier, fastest first; anything below the last bound is eth1g.
TIER_THRESHOLDS_GBIT: tuple[tuple[str, float], ...] = (("nvlink", 200.0), ("ib", 100.0), ("eth10g", 5.0))

_UNITS = {"bit": 1.0, "kbit": 1e3, "mbit": 1e6, "gbit": 1e9, "tbit": 1e12,
          "bps": 8.0, "kbps": 8e3, "mbps": 8e6, "gbps": 8e9}


def classify_tier(gbit_per_s: float, *, nvlink: bool = False) -> str:
    """The tier of a link that measured ``gbit_per_s`` (nvlink=True: NVLink seen by NVML)."""
    if math.isnan(gbit_per_s) or gbit_per_s < 0:  # NaN or negative: a broken measurement
        raise ValueError(f"bandwidth={gbit_per_s!r} is invalid: give a measured rate >= 0 in Gbit/s")
    if nvlink:
        return "nvlink"
    for tier, bound in TIER_THRESHOLDS_GBIT:
        if gbit_per_s >= bound if tier != "nvlink" else gbit_per_s > bound:
            return tier
    return "eth1g"


def parse_rate(text: str) -> float:
    """A rate in tc's spelling ("10gbit", "100mbit", "1.5gbit", "800kbit", "125mbps") -> bits/s.

    >>> parse_rate("100mbit")
    100000000.0
    """
    s = str(text).strip().lower()
    for unit in sorted(_UNITS, key=len, reverse=True):
        if s.endswith(unit):
            number = s[: -len(unit)]
            try:
                value = float(number) * _UNITS[unit]
            except ValueError:
                break
            if value > 0 and math.isfinite(value):  # NOTE: float() reads "inf" too
                return value
            break
    raise ValueError(f"link={text!r} is invalid: write a positive rate like 10gbit, 100mbit or 800kbit")


_SIZES = {"b": 1, "kb": 1 << 10, "k": 1 << 10, "mb": 1 << 20, "m": 1 << 20, "gb": 1 << 30, "g": 1 << 30}


def parse_size(text: str) -> int:
    """A byte count: "4096", "64KB", "4MB", "1GB" (binary units, like nccl-tests' -b/-e).

    >>> parse_size("4MB")
    4194304
    """
    s = str(text).strip().lower()
    for unit in sorted(_SIZES, key=len, reverse=True):
        if s.endswith(unit) and s[: -len(unit)].strip():
            s, mult = s[: -len(unit)], _SIZES[unit]
            break
    else:
        mult = 1
    try:
        value = int(float(s) * mult)
    except (ValueError, OverflowError):  # OverflowError: "inf", "1e400"
        value = 0
    if value < 4:
        raise ValueError(f"bytes={text!r} is invalid: give a size of at least 4 bytes, e.g. 4096, 64KB or 4MB")
    return value
