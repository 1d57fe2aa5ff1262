"""`import hetero_strategy` registers strategy="hetero" lazily: it imports neither Lightning nor
transformers, torchmetrics or Accelerate, yet `Trainer(strategy="hetero")` and `Fabric(strategy="hetero")` work whichever is imported first."""

from __future__ import annotations

import subprocess
import sys

_CHECK = """
import sys
{first}
heavy = {{"lightning", "transformers", "torchmetrics", "accelerate"}} & set(sys.modules)
assert not {lazy} or not heavy, f"import hetero_strategy imported {{sorted(heavy)}}"
{second}
import lightning as L
from lightning.pytorch.strategies import StrategyRegistry
assert {{"hetero", "hetero_topk", "hetero_topk_allreduce", "hetero_auto", "hetero_tiered", "hetero_spawn"}} <= set(StrategyRegistry), list(StrategyRegistry)
from lightning.fabric.strategies import STRATEGY_REGISTRY
assert {{"hetero", "hetero_topk", "hetero_tiered", "hetero_spawn"}} <= set(STRATEGY_REGISTRY), list(STRATEGY_REGISTRY)
fabric = L.Fabric(strategy="hetero_topk", accelerator="cpu", devices=1)
assert type(fabric.strategy).__name__ == "HeteroFabricStrategy", type(fabric.strategy)
assert fabric.strategy.hetero_config.compression.method == "topk"
trainer = L.Trainer(strategy="hetero", accelerator="cpu", devices=1, logger=False)
print(type(trainer.strategy).__name__)
"""


_ORDERS = [
    ("import hetero_strategy", "import lightning", True),          # isort's order: h before l
    ("import lightning", "import hetero_strategy", False),
    ("from hetero_strategy import HeteroStrategy", "pass", False),  # the adapter itself pulls Lightning in
    ("import hetero_strategy", "from lightning.fabric import Fabric", True),  # Fabric first, then the Trainer
    ("from hetero_strategy import HeteroFabricStrategy", "pass", False),
]


def test_hetero_registers_whatever_the_import_order(tmp_path):
    # NOTE: one fresh interpreter per order (an import order is only observable once), all at once:
    # each spends most of its time importing Lightning, so together they take the time of one or two.
    # Output goes to files: pipes read one at a time could fill and block the other interpreters.
    logs = [tmp_path / f"order{i}.log" for i in range(len(_ORDERS))]
    procs = []
    try:
        for (first, second, lazy), log in zip(_ORDERS, logs):
            with log.open("w") as out:
                procs.append(subprocess.Popen([sys.executable, "-W", "error::UserWarning:hetero_strategy", "-c",
                                               _CHECK.format(first=first, second=second, lazy=lazy)],
                                              stdout=out, stderr=subprocess.STDOUT, text=True))
        for p in procs:
            p.wait(timeout=180)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    for (first, second, _), p, log in zip(_ORDERS, procs, logs):
        text = log.read_text()
        assert p.returncode == 0, f"{first}; {second}:\n{text[-3000:]}"
        assert text.strip().endswith("HeteroStrategy"), (first, second, text[-3000:])
