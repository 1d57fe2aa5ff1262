"""Answers -> an Accelerate config YAML, a hetero config YAML and the commands that launch them.

The Accelerate file comes from :func:`hetero_strategy.accelerate.launch_config.cluster_config`
(the adapter owns everything Accelerate-specific, imported only when a file is written); the
hetero settings go to their own file through ``HeteroConfig.to_yaml`` and reach the job through
``HETERO_STRATEGY_CONFIG``. On CPU the launch line carries ``ACCELERATE_USE_CPU=true``: see that
module's docstring for why.

Example::

    paths = write_configs(answers, Path("."))
    print(launch_command(answers, paths, "train.py"))
"""

from __future__ import annotations

import os
import shlex
import tempfile
from dataclasses import dataclass
from pathlib import Path

from hetero_strategy.config import CONFIG_ENV, HeteroConfig
from hetero_strategy.wizard.question import Answers

__all__ = ["ConfigPaths", "accelerate_config", "hetero_config", "launch_command", "lightning_line",
           "write_configs"]


@dataclass(frozen=True)
class ConfigPaths:
    accelerate: Path
    hetero: Path


def accelerate_config(answers: Answers):
    """The Accelerate ``ClusterConfig`` the answers describe."""
    from hetero_strategy.accelerate.launch_config import cluster_config

    return cluster_config(answers.world_size, answers.num_machines, answers["device"] == "cpu",
                          sharded=answers.get("parallelism") == "sharded",
                          machine_rank=answers.get("machine_rank", 0), main_process_ip=answers.get("main_process_ip"),
                          main_process_port=answers.get("main_process_port"))


def hetero_config(answers: Answers) -> HeteroConfig:
    balance = answers.get("balance", "probe")
    return HeteroConfig.from_flat(
        capacities=answers.get("capacities") if balance == "capacities" else None,
        batch_sizes=answers.get("batch_sizes") if balance == "batch_sizes" else None,
        tiers=answers.get("tiers"), compression=answers.get("compression", "none"),
        calibrate=bool(answers.get("calibrate", False)),
    )


def write_configs(answers: Answers, output_dir: Path, *, accelerate_name: str = "accelerate.yaml",
                  hetero_name: str = "hetero.yaml") -> ConfigPaths:
    """Both files or neither: both configs are built (and checked) first, written into a staging
    folder beside them, then renamed into place."""
    accelerate, hetero = accelerate_config(answers), hetero_config(answers)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = ConfigPaths(accelerate=output_dir / accelerate_name, hetero=output_dir / hetero_name)
    with tempfile.TemporaryDirectory(dir=output_dir, prefix=".hetero-config-") as staging:
        staged = ConfigPaths(accelerate=Path(staging) / "accelerate.yaml", hetero=Path(staging) / "hetero.yaml")
        accelerate.to_yaml_file(str(staged.accelerate))
        hetero.to_yaml(staged.hetero)
        os.replace(staged.accelerate, paths.accelerate)
        os.replace(staged.hetero, paths.hetero)
    return paths


def launch_command(answers: Answers, paths: ConfigPaths, script: str) -> str:
    """The shell line that starts the job (on every machine, for several machines)."""
    env = [f"{CONFIG_ENV}={shlex.quote(str(paths.hetero))}"]
    if answers["device"] == "cpu":
        env.append("ACCELERATE_USE_CPU=true")  # the ranks are only CPU ranks with it; see the module docstring
    return " ".join([*env, "accelerate", "launch", "--config_file", shlex.quote(str(paths.accelerate)),
                     shlex.quote(script)])


def lightning_line(answers: Answers, paths: ConfigPaths) -> str:
    """The equivalent Lightning Trainer (Lightning starts the processes of one machine itself)."""
    accelerator = "cpu" if answers["device"] == "cpu" else "gpu"
    devices = answers.world_size // answers.num_machines
    strategy = "HeteroFSDPStrategy" if answers.get("parallelism") == "sharded" else "HeteroStrategy"
    return (f'Trainer(strategy={strategy}(config="{paths.hetero}"), accelerator="{accelerator}", '
            f"devices={devices}, num_nodes={answers.num_machines})")
