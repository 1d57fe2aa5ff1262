"""The wizard's closing report: the answers and the files written, then (once the files have been
checked) the exact launch lines.

Example::

    print_summary(Console(), answers, paths)
    print_launch(Console(), answers, paths, script="train.py")
"""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from hetero_strategy.wizard.question import Answers, as_text
from hetero_strategy.wizard.questions import QUESTIONS
from hetero_strategy.wizard.writers import ConfigPaths, launch_command, lightning_line

__all__ = ["print_launch", "print_summary"]


def answers_table(answers: Answers) -> Table:
    table = Table(title="hetero-strategy config", show_header=True)
    table.add_column("question")
    table.add_column("answer")
    by_name = {q.name: q for q in QUESTIONS}
    for name, value in answers.items():
        q = by_name[name]
        text = q.show(value) if q.kind == "text" else as_text(value)
        table.add_row(name, "-" if text in ("", "None") else text)  # "-": the library's own default
    return table


def print_summary(console: Console, answers: Answers, paths: ConfigPaths) -> None:
    console.print(answers_table(answers))
    console.print(f"wrote {paths.accelerate} (Accelerate) and {paths.hetero} (hetero)")
    if answers.num_machines > 1:
        console.print(f"run on every machine, each with its own machine_rank: re-run this wizard there with "
                      f"--machine-rank R (this file has machine_rank={answers.get('machine_rank', 0)})")


def print_launch(console: Console, answers: Answers, paths: ConfigPaths, *, script: str) -> None:
    """The last lines of the wizard: what to run, once the files have passed ``hetero-strategy check``."""
    # NOTE: soft_wrap and no markup: the command lines must stay one copy-pastable line at any width.
    console.print("Launch with Accelerate:")
    console.print(launch_command(answers, paths, script), soft_wrap=True, markup=False, highlight=False)
    console.print("or with Lightning:")
    console.print(lightning_line(answers, paths), soft_wrap=True, markup=False, highlight=False)
