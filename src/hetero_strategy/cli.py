"""The ``hetero-strategy`` command: one subcommand per module in ``hetero_strategy.commands``.

Each command module exposes ``NAME``, ``HELP`` and ``add_arguments(parser)`` plus ``run(args) -> int``;
adding a command means adding its module name to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["COMMANDS", "build_parser", "main"]

COMMANDS: list[str] = ["demo", "emulate", "profile", "bench", "config", "check", "plan"]


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """The parser of every subcommand, or with ``command`` of that one only: the others are still
    listed (name and help, for ``--help``) but their arguments are not built (``bench``'s import
    every benchmark module, seconds of work that ``plan`` or ``profile`` need not wait for)."""
    parser = argparse.ArgumentParser(
        prog="hetero-strategy",
        description="Data-parallel training for heterogeneous GPU clusters (Lightning / Accelerate).",
    )
    sub = parser.add_subparsers(dest="command", metavar="COMMAND")
    for name in COMMANDS:
        module = importlib.import_module(f"hetero_strategy.commands.{name}")
        p = sub.add_parser(module.NAME, help=module.HELP, description=module.HELP)
        if command is None or module.NAME == command:
            module.add_arguments(p)
        p.set_defaults(_run=module.run)
    return parser


def main(argv: list[str] | None = None) -> int:
    from hetero_strategy.commands.signals import stopping_on_signals

    try:
        with stopping_on_signals():  # every command's ranks and emulated cluster go on SIGTERM/INT/HUP
            argv = sys.argv[1:] if argv is None else list(argv)
            # the top-level parser takes no option but -h: the first other word names the command
            chosen = next((a for a in argv if not a.startswith("-")), None)
            parser = build_parser(chosen if chosen in COMMANDS else "")  # "": no command needs its arguments
            args = parser.parse_args(argv)
            if not getattr(args, "_run", None):
                parser.print_help()
                return 0
            return int(args._run(args) or 0)
    except KeyboardInterrupt:
        print("hetero-strategy: interrupted; every rank it started was stopped", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
