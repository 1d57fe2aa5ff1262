"""One question of the wizard: its wording, its choices, its default and how an answer is checked.

A question never talks to the terminal itself; :mod:`hetero_strategy.wizard.engine` asks it
(questionary menu, ``--defaults``, ``--answers`` or a flag), so every way of answering goes through
the same default and the same ``parse``.

Example::

    q = Question(name="device", kind="select", message="Which type of machine are you using?",
                 choices=lambda a: [("cpu", "CPU"), ("gpu", "GPU")], default=lambda a: "cpu")
    q.parse("GPU", Answers())    # -> "gpu"
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

__all__ = ["REQUIRED", "Answers", "Question", "WizardError", "as_text"]

REQUIRED = type("Required", (), {"__repr__": lambda self: "REQUIRED"})()
"""A default that says: there is no sensible default, the question must be answered."""


class WizardError(Exception):
    """An answer that cannot be used; the message says which question, the value and the fix."""


class Answers(dict):
    """Answers given so far, by question name, plus the facts about this machine the questions read.

    Later questions look at earlier answers (the world size decides how many capacities to give).
    """

    def __init__(self, *, gpus: int = 0, output_dir: Path | str = ".") -> None:
        super().__init__()
        self.gpus = gpus
        """CUDA devices visible to the wizard; decides the device and process-count defaults."""
        self.output_dir = Path(output_dir)
        """Where the files go (a profile measured by the wizard is written there too)."""

    @property
    def world_size(self) -> int:
        return int(self.get("num_processes", 1))

    @property
    def num_machines(self) -> int:
        return int(self.get("num_machines", 1))


def _always(answers: Answers) -> bool:
    return True


@dataclass(frozen=True, kw_only=True)
class Question:
    """A question; the callables take the answers so far."""

    name: str
    """Key in the answers file and in ``Answers``; ``--name-with-dashes`` is its flag."""
    kind: str
    """select (arrow-key menu), text or confirm."""
    message: Callable[[Answers], str] | str
    default: Callable[[Answers], Any]
    """The proposed value (None is a value, e.g. "measure at start-up"); REQUIRED: it must be answered."""
    choices: Callable[[Answers], list[tuple[Any, str]]] | None = None
    """select only: (value, title) pairs."""
    parse: Callable[[str, Answers], Any] | None = None
    """text only: text -> value; raises ValueError (e.g. a ConfigError) whose message is the reason."""
    show: Callable[[Any], str] = str
    """value -> the text a text prompt shows as its default."""
    asked: Callable[[Answers], bool] = _always
    """Whether to ask it (interactively) given the answers so far."""
    applies: Callable[[Answers], bool] | None = None
    """Whether it has an answer at all (None: when asked). A question may apply without being asked:
    it then takes its default unless a flag or the answers file gives one."""
    note: Callable[[Answers], str | None] | None = None
    """A line printed before the question is asked (e.g. what a profile proposes)."""
    caution: Callable[[Any, Answers], str | None] | None = None
    """A line printed after an answer that is valid but likely not what was meant (e.g. one process),
    however it was given: typed, a flag, the answers file or the default."""
    help: str = ""

    def text_of(self, answers: Answers) -> str:
        return self.message(answers) if callable(self.message) else self.message

    def is_applicable(self, answers: Answers) -> bool:
        return (self.applies or self.asked)(answers)

    def parse_answer(self, value: Any, answers: Answers) -> Any:
        """A value from a menu, a flag or the answers file -> the checked answer (ValueError if bad)."""
        if self.kind == "select":
            return self._pick(value, answers)
        if self.kind == "confirm":
            return _yes_no(self.name, value)
        assert self.parse is not None, f"text question {self.name} needs parse"
        return self.parse(as_text(value), answers)

    def _pick(self, value: Any, answers: Answers) -> Any:
        assert self.choices is not None, f"select question {self.name} needs choices"
        options = self.choices(answers)
        for choice, _ in options:
            # NOTE: flags and YAML give "1" or 1, "GPU" or "gpu"; compare spellings, keep the choice's type.
            if str(choice).lower() == str(value).strip().lower():
                return choice
        names = ", ".join(str(c) for c, _ in options)
        raise ValueError(f"{self.name}={value!r} is invalid: choose one of {names}")


def as_text(value: Any) -> str:
    """A YAML value as the text a user would type: lists comma-separated, None empty."""
    if value is None:
        return ""
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, (list, tuple)):
        return ", ".join(str(v) for v in value)
    return str(value)


_YES = ("y", "yes", "true", "1", "on")
_NO = ("n", "no", "false", "0", "off")


def _yes_no(name: str, value: Any) -> bool:
    if isinstance(value, bool):
        return value
    text = str(value).strip().lower()
    if text in _YES or text in _NO:
        return text in _YES
    raise ValueError(f"{name}={value!r} is invalid: answer yes or no")
