"""Turn typed answers into values, refusing bad ones with the reason the prompt shows.

Where the value is a hetero setting the check *is* the config section's own ``__post_init__`` (or
``BalanceConfig.check_world_size``): its ConfigError names the field, the value and the fix, and
the wizard shows that message rather than a second, drifting copy of the rules.

Example::

    parse_capacities("3, 1", answers)    # -> [3.0, 1.0] when the job has 2 ranks
    parse_capacities("3", answers)       # ConfigError: capacities=[3] ... give exactly 2 entries
"""

from __future__ import annotations

import json
import re
from typing import Any

from hetero_strategy.config import BalanceConfig, CompressionConfig, counted
from hetero_strategy.wizard.question import Answers

__all__ = [
    "parse_batch_sizes", "parse_capacities", "parse_host", "parse_int", "parse_profile", "parse_tiers",
    "split_list",
]


def parse_int(name: str, text: str, *, low: int, high: int | None = None) -> int:
    try:
        value = int(text.strip())
    except ValueError:
        value = None
    if value is None or value < low or (high is not None and value > high):
        bound = f"between {low} and {high}" if high is not None else f">= {low}"
        raise ValueError(f"{name}={text.strip()!r} is invalid: enter an integer {bound}")
    return value


def parse_host(text: str, answers: Answers) -> str:
    host = text.strip()
    if not host or re.search(r"\s", host):
        raise ValueError(f"main_process_ip={host!r} is invalid: enter the IP address or host name of the "
                         "machine with machine rank 0, e.g. 10.0.0.1")
    return host


def split_list(text: str) -> list[Any]:
    """ "3, 1" -> [3, 1]; entries that are not numbers stay text so the config check can name them."""
    values: list[Any] = []
    for token in re.split(r"[,\s]+", text.strip()):
        if not token:
            continue
        for kind in (int, float):
            try:
                values.append(kind(token))
                break
            except ValueError:
                continue
        else:
            values.append(token)
    return values


def parse_capacities(text: str, answers: Answers) -> list[float]:
    values = split_list(text)
    BalanceConfig(capacities=values).check_world_size(answers.world_size)
    return [float(v) for v in values]


def parse_batch_sizes(text: str, answers: Answers) -> list[int]:
    values = split_list(text)
    BalanceConfig(batch_sizes=values).check_world_size(answers.world_size)
    return values


def parse_tiers(text: str, answers: Answers) -> list[str] | None:
    """auto (or nothing) -> None; one tier -> that tier for every rank; else one tier per rank."""
    names = [str(v).lower() for v in split_list(text)]
    if names in ([], ["auto"]):
        return None
    n = answers.world_size
    tiers = names * n if len(names) == 1 else names
    CompressionConfig(tiers=tiers)  # refuses unknown tier names with the allowed ones
    if len(tiers) != n:
        # NOTE: CompressionConfig cannot check this itself (it does not know the world size).
        raise ValueError(f"tiers={names!r} is invalid: has {counted(len(names), 'entry', 'entries')} but the job has "
                         f"{counted(n, 'rank')}; "
                         f"give {n} tiers, one tier for every rank, or auto")
    return tiers


def parse_profile(text: str, answers: Answers) -> str | None:
    """A profile JSON path whose rank count matches the job; nothing -> no profile."""
    from hetero_strategy.cluster.profile import load_profile

    path = text.strip()
    if not path:
        return None
    BalanceConfig(profile=path)  # refuses a missing file and says how to write one
    try:
        ranks = len(load_profile(path).tiers)  # refuses another schema with the fix
    except (json.JSONDecodeError, KeyError, TypeError) as e:
        raise ValueError(f"profile={path!r} is invalid: not a cluster profile ({type(e).__name__}: {e}); "
                         "write one with `hetero-strategy profile --json PATH`") from None
    if ranks != answers.world_size:
        raise ValueError(f"profile={path!r} is invalid: it measured {counted(ranks, 'rank')} but the job has "
                         f"{answers.world_size}; profile the job's ranks, or leave the path empty for none")
    return path
