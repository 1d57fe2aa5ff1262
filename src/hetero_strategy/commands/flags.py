"""argparse ``type=`` checks for the commands' flags: a bad value is refused while parsing.

argparse then prints ``error: argument --rounds: '0' is invalid: give a whole number >= 1`` and
exits with status 2: the flag, the value and the fix, before any work (no emulator, no ranks).
List flags (``--compute 1.0,0.57``, ``--link 10gbit,1gbit``) keep their text once checked, since
the commands parse them further themselves. Flags that must agree with each other (as
``--compute`` and ``--link``) are checked together by :func:`cluster_args`, which raises
:class:`UsageError`; ``bench`` and ``demo`` print it and exit with status 2, as argparse does.

Example::

    parser.add_argument("--rounds", type=count(1), default=5)
    parser.add_argument("--compute", type=shares, default="1.0,0.57")
"""

from __future__ import annotations

import argparse
import math
import os
import tempfile
from collections.abc import Callable, Iterable
from typing import Any

__all__ = ["MTU", "UsageError", "add_cluster_flags", "choices_list", "cluster_args", "cluster_spec", "count", "input_file", "number",
           "output_dir", "output_file", "rate", "rates", "shares"]


class UsageError(ValueError):
    """Command-line values that do not fit together: the message names the flags, values and fix."""


def add_cluster_flags(parser: argparse.ArgumentParser, compute: str = "1.0,0.57", link: str = "10gbit",
                      link_why: str = "") -> None:
    """``--compute`` (per-rank CPU shares) and ``--link`` (per-rank link rates) of an emulated
    cluster, with their defaults; :func:`cluster_args` checks the two together."""
    parser.add_argument("--compute", type=shares, default=compute, help=f"per-rank CPU share (default {compute})")
    parser.add_argument("--link", type=rates, default=link, help=f"per-rank link rate (default {link}{link_why})")


def _bad(text: str, fix: str) -> argparse.ArgumentTypeError:
    return argparse.ArgumentTypeError(f"{text!r} is invalid: {fix}")


def count(minimum: int = 1, maximum: int | None = None) -> Callable[[str], int]:
    """A whole number >= ``minimum`` (and <= ``maximum`` when given)."""
    allowed = f">= {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"

    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            raise _bad(text, f"give a whole number {allowed}") from None
        if value < minimum or (maximum is not None and value > maximum):
            raise _bad(text, f"give a whole number {allowed}")
        return value

    return parse


MTU = count(576, 9000)
"""``--mtu`` of an emulated cluster: bytes, 576 to 9000 (ClusterSpec's bound: a packet stays inside tbf's burst)."""


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


def rate(text: str) -> str:
    """One link rate in tc's spelling (10gbit, 100mbit, 800kbit)."""
    from hetero_strategy.cluster.tiers import parse_rate

    try:
        parse_rate(text)
    except ValueError:
        raise _bad(text, "give one rate such as 50mbit, 1gbit or 10gbit") from None
    return text


def output_file(text: str) -> str:
    """A file to write once the work is done, checked before any work starts: a path that is not
    a directory, in a directory that exists and takes a new file (a test file is made and removed)."""
    path = os.path.abspath(text) if text and "\0" not in text else ""
    if not path:
        raise _bad(text, "give the path of a file to write, e.g. results.json")
    _statable(text, path)
    if os.path.isdir(path):
        raise _bad(text, "that is a directory; give a file path inside it, e.g. DIR/results.json")
    _writable_dir(text, os.path.dirname(path))
    return text


def input_file(text: str) -> str:
    """A file to read: one that exists, is a regular file and can be opened."""
    if not text or "\0" in text or not os.path.isfile(text):
        raise _bad(text, "no such file; give the path of an existing file")
    if not os.access(text, os.R_OK):
        raise _bad(text, "cannot read it; give a readable file")
    return text


def output_dir(text: str) -> str:
    """A directory to write into: one that exists and takes new files, or a new one whose parent does."""
    path = os.path.abspath(text) if text and "\0" not in text else ""
    if not path:
        raise _bad(text, "give a directory path, e.g. run/")
    _statable(text, path)
    if os.path.exists(path) and not os.path.isdir(path):
        raise _bad(text, "that is a file, not a directory; give a directory path")
    _writable_dir(text, path if os.path.isdir(path) else os.path.dirname(path))
    return text


def _statable(text: str, path: str) -> None:
    """Refuse a path the system cannot even look up (a name too long, a loop of links)."""
    try:
        os.stat(path)
    except (FileNotFoundError, NotADirectoryError):
        pass
    except OSError as e:
        raise _bad(text, f"not a usable path ({e.strerror or e}); give another") from None


def _writable_dir(text: str, folder: str) -> None:
    if not os.path.isdir(folder):
        raise _bad(text, f"the directory {folder} does not exist; create it (mkdir -p {folder}) or give a path "
                   "in an existing directory")
    try:
        with tempfile.TemporaryFile(dir=folder):
            pass
    except OSError as e:
        raise _bad(text, f"cannot write in {folder} ({e.strerror or e}); give a path in a writable directory") from None


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


def cluster_args(compute: str, link: str | None, min_ranks: int = 2) -> tuple[list[float], list[str] | None]:
    """``--compute`` and ``--link`` of an emulated cluster, checked together as the emulator will
    (:class:`~hetero_strategy.emulate.spec.ClusterSpec`: the counts must agree): (per-rank
    shares, per-rank links or None).

    Raises:
        UsageError: naming the flags, their values and the fix.
    """
    from hetero_strategy.emulate.spec import parse_float_list, parse_link_list

    try:
        shares_ = parse_float_list(compute, "--compute")
    except ValueError as e:
        raise UsageError(str(e)) from None
    links = parse_link_list(link)
    if len(shares_) < min_ranks:
        raise UsageError(f"--compute={compute!r} is invalid: give one share per rank, at least {min_ranks}, "
                         "e.g. 1.0,0.57")
    cluster_spec({"--compute": compute, "--link": link}, compute=shares_, links=links)
    return shares_, links


def cluster_spec(flags: dict[str, Any], **fields: Any) -> Any:
    """``ClusterSpec(**fields)``, the emulator's own check; refused as a :class:`UsageError` that
    names the flags given (``flags``: flag -> its text, None when not given)."""
    from hetero_strategy.emulate.spec import ClusterSpec

    try:
        return ClusterSpec(**fields)
    except ValueError as e:
        given = " ".join(f"{name}={text!r}" for name, text in flags.items() if text is not None)
        raise UsageError(f"{given} do not fit together: {e}" if " " in given else f"{given}: {e}") from None
