"""argparse ``type=`` checks for the commands' flags: a bad value is refused while parsing.

argparse then prints ``error: argument --rounds: '0' is invalid: give a whole number >= 1`` and
exits with status 2: the flag, the value and the fix, before any work (no emulator, no ranks).
List flags (``--compute 1.0,0.57``, ``--link 10gbit,1gbit``) keep their text once checked, since
the commands parse them further themselves.

Example::

    parser.add_argument("--rounds", type=count(1), default=5)
    parser.add_argument("--compute", type=shares, default="1.0,0.57")
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Callable, Iterable

__all__ = ["choices_list", "cluster_args", "count", "number", "rates", "shares"]


def _bad(text: str, fix: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text!r} is invalid: {fix}")


def count(minimum: int = 1) -> Callable[[str], int]:
    """A whole number >= ``minimum``."""

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _bad(text, f"give a whole number >= {minimum}") from None
        if value < minimum:
            raise _bad(text, f"give a whole number >= {minimum}")
        return value

    return parse


def number(low: float = 0.0, high: float = math.inf, *, low_open: bool = True, high_open: bool = False,
           what: str = "a number") -> Callable[[str], float]:
    """A finite float in the interval from ``low`` to ``high`` (open or closed at each end)."""
    span = f"{'(' if low_open else '['}{low:g}, {high:g}{')' if high_open or math.isinf(high) else ']'}"

    def parse(text: str) -> float:
        try:
            value = float(text)
        except ValueError:
            raise _bad(text, f"give {what} in {span}") from None
        above = value > low if low_open else value >= low
        below = value < high if high_open else value <= high
        if not (math.isfinite(value) and above and below):
            raise _bad(text, f"give {what} in {span}")
        return value

    return parse


def shares(text: str) -> str:
    """Comma-separated CPU shares of one core, each in (0, 1] (a rank gets at most its pinned core)."""
    parts = [p.strip() for p in str(text).split(",") if p.strip()]  # a trailing comma is fine
    check = number(0.0, 1.0)
    try:
        if not parts:
            raise argparse.ArgumentTypeError(text)
        for p in parts:
            check(p)
    except argparse.ArgumentTypeError:
        raise _bad(text, "give one share of a core per rank, each in (0, 1], e.g. 1.0,0.57") from None
    return text


def rates(text: str) -> str:
    """Comma-separated link rates in tc's spelling (10gbit, 100mbit, 800kbit; none: unshaped)."""
    from hetero_strategy.cluster.tiers import parse_rate
    from hetero_strategy.emulate.spec import UNSHAPED

    for part in str(text).split(","):
        if part.strip().lower() in UNSHAPED:  # an unshaped link
            continue
        try:
            parse_rate(part)
        except ValueError:
            raise _bad(text, f"{part.strip()!r} is not a rate; give rates such as 10gbit,1gbit,100mbit") from None
    return text


def choices_list(allowed: Iterable[str]) -> Callable[[str], str]:
    """Comma-separated names, each one of ``allowed``."""
    names = tuple(allowed)

    def parse(text: str) -> str:
        picked = [p.strip() for p in str(text).split(",") if p.strip()]
        unknown = [p for p in picked if p not in names]
        if not picked or unknown:
            what = f"{unknown[0]!r} is unknown; " if unknown else ""
            raise _bad(text, f"{what}choose from {', '.join(names)} (comma-separated)")
        return text

    return parse


def cluster_args(compute: str, link: str | None, min_ranks: int = 2) -> tuple[list[float], list[str] | None] | str:
    """``--compute`` and ``--link`` of an emulated cluster, checked together (the counts must
    agree); an error message naming the flags otherwise."""
    from hetero_strategy.emulate.spec import ClusterSpec, parse_float_list, parse_link_list

    shares_ = parse_float_list(compute, "--compute")
    links = parse_link_list(link)
    if len(shares_) < min_ranks:
        return f"--compute={compute!r} is invalid: give one share per rank, at least {min_ranks}, e.g. 1.0,0.57"
    try:
        ClusterSpec(compute=shares_, links=links)
    except ValueError as e:
        return f"--compute={compute!r} --link={link!r} do not fit together: {e}"
    return shares_, links
