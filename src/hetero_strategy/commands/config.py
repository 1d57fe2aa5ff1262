"""``hetero-strategy config``: a questionnaire that writes accelerate.yaml + hetero.yaml and the launch line.

Example::

    hetero-strategy config                                   # arrow-key menus, defaults shown
    hetero-strategy config --profile cluster.json            # defaults proposed from a measurement
    hetero-strategy config --defaults --device cpu --num-processes 2 --output-dir run/
    hetero-strategy config --answers answers.yaml            # question name -> answer, for CI
    HETERO_STRATEGY_CONFIG=hetero.yaml accelerate launch --config_file accelerate.yaml train.py

Every question has a flag (``--name-with-dashes``) and a key in the answers file; flags win over the
file. With ``--defaults`` or ``--answers`` nothing is asked: unanswered questions take their default.
"""

from __future__ import annotations

import argparse
from pathlib import Path
from typing import Any

NAME = "config"
HELP = "Answer a few questions; write an Accelerate config + a hetero config and print the launch command."

__all__ = ["HELP", "NAME", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from hetero_strategy.commands.flags import output_dir
    from hetero_strategy.wizard import QUESTIONS, Answers, flag_of

    parser.add_argument("--output-dir", type=output_dir, default=".", help="where to write the two files (default: here)")
    parser.add_argument("--accelerate-file", type=_file_name, default="accelerate.yaml",
                        help="name of the Accelerate config (in --output-dir)")
    parser.add_argument("--hetero-file", type=_file_name, default="hetero.yaml",
                        help="name of the hetero config (in --output-dir)")
    parser.add_argument("--script", default="train.py", help="training script named in the printed command")
    parser.add_argument("--defaults", action="store_true", help="ask nothing; take the default answers")
    parser.add_argument("--answers", default=None, metavar="YAML",
                        help="a mapping question name -> answer; ask nothing (defaults for the rest)")
    group = parser.add_argument_group("answers", "one flag per question (the key of the answers file)")
    for q in QUESTIONS:
        extra = f" ({q.help})" if q.help else ""
        group.add_argument(flag_of(q.name), dest=q.name, default=None, metavar="VALUE",
                           help=f"{q.text_of(Answers())}{extra}".replace("%", "%%"))


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.config import ConfigError
    from hetero_strategy.wizard import Answers, WizardError, collect, write_configs
    from hetero_strategy.wizard.summary import print_launch, print_summary

    console, errors = Console(), Console(stderr=True)
    out = Path(args.output_dir)
    try:
        _check_outputs(args, out)  # before any question: the profile question may run the profiler
        answers = Answers(gpus=_visible_gpus(), output_dir=out)
        collect(answers, _presets(args), interactive=not (args.defaults or args.answers),
                say=lambda line: console.print(line, markup=False, highlight=False))
        paths = write_configs(answers, out, accelerate_name=args.accelerate_file, hetero_name=args.hetero_file)
    except (WizardError, ConfigError) as e:
        errors.print(f"config: {e}", style="red", markup=False, highlight=False)
        return 2
    except KeyboardInterrupt:
        errors.print("config: cancelled; nothing written", style="yellow", markup=False)
        return 130
    print_summary(console, answers, paths)
    status = _check_written(paths.hetero, answers.get("profile"), console, errors)
    if status == 0:  # the launch line last, where a user looks for it, and only for files that check
        print_launch(console, answers, paths, script=args.script)
    return status


def _file_name(text: str) -> str:
    if not text or text in (".", "..") or "/" in text or "\0" in text:
        raise argparse.ArgumentTypeError(f"{text!r} is invalid: give a file name without a directory, e.g. "
                                         "hetero.yaml (the directory is --output-dir)")
    return text


def _check_outputs(args: argparse.Namespace, out: Path) -> None:
    from hetero_strategy.wizard import WizardError

    if args.accelerate_file == args.hetero_file:
        raise WizardError(f"--hetero-file={args.hetero_file!r} is invalid: it is also --accelerate-file; give "
                          "the two files different names")
    for flag, name in (("--accelerate-file", args.accelerate_file), ("--hetero-file", args.hetero_file)):
        if (out / name).is_dir():
            raise WizardError(f"{flag}={name!r} is invalid: {out / name} is a directory; give another name")


def _check_written(path: Path, profile: str | None, console, errors) -> int:
    """``hetero-strategy check`` on the file just written: its resolved settings, or why not."""
    from hetero_strategy.commands.check import check_files, settings_table

    config, problems = check_files(path, profile)
    for line in problems:  # NOTE: a wizard bug, not the user's: the answers were checked one by one
        errors.print(f"config: the file written does not check: {line}", style="red", markup=False, highlight=False)
    if problems:
        return 1
    console.print(settings_table(config, path))
    console.print(f"check: {path} is valid", markup=False, highlight=False, soft_wrap=True)
    return 0


def _presets(args: argparse.Namespace) -> dict[str, Any]:
    """The answers file, then the flags on top of it."""
    from hetero_strategy.config.files import read_yaml
    from hetero_strategy.wizard import QUESTIONS, WizardError

    presets: dict[str, Any] = {}
    if args.answers:
        loaded = read_yaml(args.answers, "answers")  # ConfigError naming the file, whatever is wrong with it
        loaded = {} if loaded is None else loaded
        if not isinstance(loaded, dict):
            raise WizardError(f"answers={args.answers!r} is invalid: give a mapping question name -> answer")
        presets.update(loaded)
    for q in QUESTIONS:
        value = getattr(args, q.name, None)
        if value is not None:
            presets[q.name] = value
    return presets


def _visible_gpus() -> int:
    import torch

    return torch.cuda.device_count() if torch.cuda.is_available() else 0
