"""The ``hetero-strategy config`` wizard: questions -> an Accelerate config + a hetero config + launch lines.

| module | role |
|---|---|
| ``question`` | one question: wording, choices, default, check of an answer |
| ``questions`` | the questions in order (Accelerate's wording for the launcher part) |
| ``checks`` | typed text -> values; hetero values are checked by the config sections themselves |
| ``proposal`` | a cluster profile -> proposed tiers, capacities, compression |
| ``profiler`` | runs ``hetero-strategy profile`` on this machine's ranks |
| ``engine`` | asks (questionary), or takes flags / an answers file / the defaults |
| ``writers`` | accelerate.yaml, hetero.yaml, the launch command and the Lightning line |
| ``summary`` | the closing report (rich) |

Example::

    answers = collect(Answers(), {"device": "cpu", "num_processes": 2}, interactive=False)
    paths = write_configs(answers, Path("."))
    print(launch_command(answers, paths, "train.py"))
"""

from hetero_strategy.wizard.engine import collect, expand_presets, flag_of
from hetero_strategy.wizard.proposal import Proposal, propose, propose_compression
from hetero_strategy.wizard.question import REQUIRED, Answers, Question, WizardError
from hetero_strategy.wizard.questions import IMPLIED, QUESTIONS
from hetero_strategy.wizard.writers import (
    ConfigPaths,
    accelerate_config,
    hetero_config,
    launch_command,
    lightning_line,
    write_configs,
)

__all__ = [
    "IMPLIED", "QUESTIONS", "REQUIRED", "Answers", "ConfigPaths", "Proposal", "Question", "WizardError",
    "accelerate_config", "collect", "expand_presets", "flag_of", "hetero_config", "launch_command",
    "lightning_line", "propose", "propose_compression", "write_configs",
]
