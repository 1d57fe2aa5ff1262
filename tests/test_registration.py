"""`import hetero_strategy` registers strategy="hetero" lazily: Lightning is not imported by it, yet
`Trainer(strategy="hetero")` works whichever of the two is imported first."""

from __future__ import annotations

import subprocess
import sys

import pytest

_CHECK = """
import sys
{first}
assert not {lazy} or "lightning" not in sys.modules, "import hetero_strategy imported Lightning"
{second}
import lightning as L
from lightning.pytorch.strategies import StrategyRegistry
assert {{"hetero", "hetero_topk", "hetero_tiered", "hetero_spawn"}} <= set(StrategyRegistry), list(StrategyRegistry)
trainer = L.Trainer(strategy="hetero", accelerator="cpu", devices=1, logger=False)
print(type(trainer.strategy).__name__)
"""


@pytest.mark.parametrize(("first", "second", "lazy"), [
    ("import hetero_strategy", "import lightning", True),          # isort's order: h before l
    ("import lightning", "import hetero_strategy", False),
    ("from hetero_strategy import HeteroStrategy", "pass", False),  # the adapter itself pulls Lightning in
])
def test_hetero_registers_whatever_the_import_order(first, second, lazy):
    code = _CHECK.format(first=first, second=second, lazy=lazy)
    out = subprocess.run([sys.executable, "-W", "error::UserWarning:hetero_strategy", "-c", code],
                         capture_output=True, text=True, timeout=120, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    assert out.stdout.strip().endswith("HeteroStrategy")
