"""Walk the questions once, taking each answer from a flag / the answers file, a menu, or the default.

Every way of answering meets the same code: a preset (flag or ``--answers``) is checked by the
question's ``parse``; ``--defaults`` takes the default *as the prompt would show it* and parses it
back, which is exactly what pressing Enter at the prompt does. So accepting every default
interactively and ``--defaults`` cannot write different files.

Example::

    answers = collect(Answers(), {"num_processes": 2, "device": "cpu"}, interactive=False)
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from hetero_strategy.wizard.question import REQUIRED, Answers, Question, WizardError
from hetero_strategy.wizard.questions import IMPLIED, QUESTIONS

__all__ = ["collect", "expand_presets", "flag_of"]

Printer = Callable[[str], None]


def flag_of(name: str) -> str:
    return "--" + name.replace("_", "-")


def expand_presets(presets: Mapping[str, Any], questions: Sequence[Question] = QUESTIONS) -> dict[str, Any]:
    """Refuse names that are no question; add the answers that the given ones imply (see IMPLIED)."""
    known = {q.name for q in questions}
    for name in presets:
        if name not in known:
            raise WizardError(f"{name}={presets[name]!r} is invalid: unknown question; known questions: "
                              f"{', '.join(q.name for q in questions)}")
    out = dict(presets)
    for name, (other, value) in IMPLIED.items():
        if name in presets and other not in out:
            out[other] = value
    return out


def collect(answers: Answers, presets: Mapping[str, Any], *, interactive: bool,
            questions: Sequence[Question] = QUESTIONS, say: Printer = print) -> Answers:
    """Fill ``answers`` question by question; presets must all be used (a stray one is a mistake)."""
    presets = expand_presets(presets, questions)
    for q in questions:
        if q.is_applicable(answers):
            answers[q.name] = _answer(q, answers, presets, interactive, say)
            caution = q.caution(answers[q.name], answers) if q.caution else None
            if caution:
                say(f"warning: {caution}")
    unused = [name for name in presets if name not in answers]
    if unused:
        name = unused[0]
        raise WizardError(f"{name}={presets[name]!r} is invalid: that question is not asked with the other "
                          f"answers; remove it, or also give the answer that asks it")
    return answers


def _answer(q: Question, answers: Answers, presets: Mapping[str, Any], interactive: bool, say: Printer) -> Any:
    if q.name in presets:
        try:
            return q.parse_answer(presets[q.name], answers)
        except ValueError as e:
            raise WizardError(str(e)) from None
    if not q.asked(answers):
        return q.default(answers)  # not a question here, only a setting with a default
    if interactive:
        return _prompt(q, answers, say)
    default = q.default(answers)
    if default is REQUIRED:
        raise WizardError(f"{q.name} has no default: give it with {flag_of(q.name)} or in the answers file")
    if q.kind != "text":
        return default
    # What Enter does at the prompt: the default's text, parsed like typed text.
    try:
        return q.parse_answer(q.show(default), answers)
    except ValueError as e:
        raise WizardError(f"the default of {q.name} does not fit the other answers: {e}") from None


def _prompt(q: Question, answers: Answers, say: Printer) -> Any:
    import questionary

    if not sys.stdin.isatty():
        raise WizardError(f"{q.name} needs an answer but stdin is not a terminal; "
                          "pass --defaults, --answers FILE or the answer's flag")
    note = q.note(answers) if q.note else None
    if note:
        say(note)
    message, default = q.text_of(answers), q.default(answers)
    if q.kind == "select":
        choices = [questionary.Choice(title, value=value) for value, title in q.choices(answers)]
        return questionary.select(message, choices=choices, default=default).unsafe_ask()
    if q.kind == "confirm":
        return questionary.confirm(message, default=bool(default)).unsafe_ask()

    def validate(text: str) -> bool | str:
        try:
            q.parse_answer(text, answers)
        except ValueError as e:
            return str(e)  # questionary shows it under the prompt and keeps asking
        return True

    shown = "" if default is REQUIRED else q.show(default)

    def typed(text: str) -> str:
        return text if text.strip() else shown  # Enter on an empty line takes the default

    # NOTE: the line starts empty and the default is only a grey placeholder: a default put in the
    # line as editable text would have typed answers appended to it ("1.0, 1.0" + "3,1" -> "1.0, 1.03,1").
    # Validate on Enter only; while typing "3, 1" the half-typed "3," would flash a wrong-count error.
    hint = [("fg:ansibrightblack", shown)] if shown else None
    text = questionary.text(message, validate=lambda t: validate(typed(t)), validate_while_typing=False,
                            placeholder=hint).unsafe_ask()
    return q.parse_answer(typed(text), answers)
