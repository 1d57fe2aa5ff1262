"""``hetero-strategy check``: validate a hetero config (and a cluster profile) without running anything.

It reads the YAML, builds every section (the same ``__post_init__`` checks a run makes), and with
``--profile`` reads the profile and checks the config's per-rank lists against its rank count.
A valid config prints its resolved settings as a table (defaults filled in) and exits 0; otherwise
every error is printed, one per line, and it exits with status 2. The wizard runs it on the file
it has just written.

Example::

    hetero-strategy check hetero.yaml
    hetero-strategy check hetero.yaml --profile cluster.json
"""

from __future__ import annotations

import argparse
import dataclasses
from pathlib import Path
from typing import Any

NAME = "check"
HELP = ("Validate a hetero config YAML (and a cluster profile) without running anything; print the resolved "
        "settings or the errors, one per line.")

__all__ = ["HELP", "NAME", "add_arguments", "check_files", "run", "settings_table"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("config", metavar="CONFIG.yaml", help="the hetero config to check (`hetero-strategy config` "
                        "writes one)")
    parser.add_argument("--profile", default=None, metavar="P",
                        help="a cluster-profile JSON (`hetero-strategy profile --json`): the config's per-rank "
                             "lists must have one entry per rank it describes")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    config, problems = check_files(args.config, args.profile)
    if problems:
        errors = Console(stderr=True)
        for line in problems:
            errors.print(f"check: {line}", style="red", markup=False, highlight=False, soft_wrap=True)
        return 2
    console = Console()
    console.print(settings_table(config, args.config))
    console.print(f"check: {args.config} is valid" + (f" for the {args.profile} cluster" if args.profile else ""),
                  markup=False, highlight=False, soft_wrap=True)
    return 0


def check_files(config_path: str | Path, profile_path: str | Path | None = None) -> tuple[Any, list[str]]:
    """(the config, []) when it is valid (for the profile's ranks, given one), else (None, the errors)."""
    from hetero_strategy.cluster.profile import load_profile
    from hetero_strategy.config import ConfigError, HeteroConfig
    from hetero_strategy.config.files import read_yaml

    try:
        data = read_yaml(config_path)
    except ConfigError as e:
        return None, [str(e)]
    problems = HeteroConfig.problems(data)
    if problems:
        return None, problems
    config = HeteroConfig.from_dict(data or {})
    if profile_path is None:
        return config, []
    try:
        config.check_world_size(len(load_profile(profile_path).compute))
    except ConfigError as e:
        return None, [str(e)]
    return config, []


def settings_table(config: Any, title: str | Path = "") -> Any:
    """Every setting of ``config``, section by section; the ones not at their default are marked."""
    from rich.table import Table
    from rich.text import Text

    from hetero_strategy.config.errors import shown

    table = Table(title=f"hetero config {title}".strip(), show_header=True)
    for column in ("section", "setting", "value", ""):
        table.add_column(column)
    for section in dataclasses.fields(config):
        values = getattr(config, section.name)
        default = type(values)()
        for f in dataclasses.fields(values):
            value = getattr(values, f.name)
            changed = "set" if value != getattr(default, f.name) else ""
            table.add_row(section.name, f.name, Text(shown(value)), changed)  # Text: no markup from a value
    return table
