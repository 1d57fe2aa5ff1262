"""A Lightning ``strategy="hetero_fsdp"`` job whose rank is SIGKILLed mid-epoch restarts under
``torchrun --max-restarts 1`` from its last committed DCP checkpoint.

Oracle: the same job (tests/scripts/lightning_fsdp_fit.py) run without the kill. Its final weights
and momentum buffers, gathered whole, must be bitwise equal to the restarted run's.
"""

from __future__ import annotations

from pathlib import Path

import torch
from dist_utils import elastic_torchrun

SCRIPT = Path(__file__).parent / "scripts" / "lightning_fsdp_fit.py"


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_a_killed_rank_restarts_from_the_last_checkpoint_and_ends_bitwise_equal(tmp_path):
    whole, killed = tmp_path / "uninterrupted", tmp_path / "killed"
    elastic_torchrun(SCRIPT, whole)
    log = elastic_torchrun(SCRIPT, killed, "--kill-after", "10", restarts=1)
    assert "exitcode: -9" in log.replace("  ", " ") or "exitcode  : -9" in log
    for rank in (0, 1):
        want, got = (torch.load(run / f"final_rank{rank}.pt") for run in (whole, killed))
        assert got["restarted"] and not want["restarted"]
        # the restarted attempt trained steps 9..16 only: it resumed from step 8's checkpoint
        assert len(got["seen"]) == 8 and got["seen"] == want["seen"][8:]
        assert _same(got["weights"], want["weights"]) and _same(got["momentum"], want["momentum"])
