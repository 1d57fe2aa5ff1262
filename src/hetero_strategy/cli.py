"""The ``hetero-strategy`` command: one subcommand per module in ``hetero_strategy.commands``.

Each command module exposes ``NAME``, ``HELP`` and ``add_arguments(parser)`` plus ``run(args) -> int``;
adding a command means adding its module name to ``COMMANDS``.
"""

from __future__ import annotations

import argparse
import importlib
import sys

__all__ = ["COMMANDS", "build_parser", "console", "main"]

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
        p.set_defaults(_run=module.run, _fast_exit=getattr(module, "FAST_EXIT", False))
    return parser


def main(argv: list[str] | None = None, *, fast_exit: bool = False) -> int:
    """Run one command; its exit status. ``fast_exit`` (the console script's): a command that sets
    ``FAST_EXIT`` ends the process itself when done (:func:`_leave`)."""
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
            code = int(args._run(args) or 0)
            if fast_exit and args._fast_exit:
                _leave(code)
            return code
    except KeyboardInterrupt:
        print("hetero-strategy: interrupted; every rank it started was stopped", file=sys.stderr)
        return 130


def _leave(code: int) -> None:
    """End the process now, its output flushed and its files closed: a command that sets
    ``FAST_EXIT`` (it starts no rank, thread or process that must be waited for) skips the
    interpreter's teardown of torch and torchvision, 0.9 s of ``plan``'s 4.9 on this machine.
    Only from the console script (:func:`console`): ``main()`` in Python, ``python -m`` and
    profilers get the code back, with their exit handlers."""
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(code)


def console() -> None:
    """The ``hetero-strategy`` console script."""
    sys.exit(main(sys.argv[1:], fast_exit=True))


if __name__ == "__main__":
    sys.exit(main())
