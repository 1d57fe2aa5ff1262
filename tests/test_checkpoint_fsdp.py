"""Periodic checkpoints and elastic restart of an FSDP2 model (runtime/checkpoint.py, runtime/sharded_optim.py).

Parameters, gradients and momentum buffers are sharded over the ranks. The oracle of a resumed run
is the same job run without a failure (tests/scripts/elastic_fit.py --fsdp): its final weights and
momentum, gathered whole, must be bitwise equal; a resume on another world size must restore the
whole state that was saved.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest
import torch
from dist_utils import elastic_torchrun

SCRIPT = Path(__file__).parent / "scripts" / "elastic_fit.py"


def _torchrun(out: Path, *args: str, ranks: int = 2, restarts: int = 0) -> str:
    return elastic_torchrun(SCRIPT, out, "--fsdp", *args, ranks=ranks, restarts=restarts)


@pytest.fixture(scope="module")
def uninterrupted_fsdp(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("uninterrupted_fsdp")
    _torchrun(out)
    return out


def _same(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b))


def test_fsdp2_a_rank_killed_mid_epoch_resumes_bitwise_with_its_sharded_momentum(uninterrupted_fsdp, tmp_path):
    log = _torchrun(tmp_path, "--kill-rank", "1", "--kill-after", "10", restarts=1)
    assert "exitcode: -9" in log.replace("  ", " ") or "exitcode  : -9" in log
    for rank in (0, 1):
        want, got = (torch.load(run / f"final_rank{rank}.pt") for run in (uninterrupted_fsdp, tmp_path))
        assert _same(got["weights"], want["weights"]) and _same(got["momentum"], want["momentum"])
        resumed, saved = torch.load(tmp_path / f"resumed_rank{rank}.pt"), torch.load(tmp_path / f"saved_8_rank{rank}.pt")
        assert (resumed["steps"], resumed["position"], resumed["split"]) == (8, (1, 32), [10, 6])
        assert _same(resumed["weights"], saved["weights"]) and any(m.abs().sum() > 0 for m in resumed["momentum"])


def test_fsdp2_checkpoint_of_two_ranks_resumes_resharded_on_three(uninterrupted_fsdp, tmp_path):
    shutil.copytree(uninterrupted_fsdp / "ckpt", tmp_path / "ckpt")
    _torchrun(tmp_path, "--steps", "19", ranks=3)
    want = torch.load(uninterrupted_fsdp / "final_rank0.pt")  # the state after step 16, whole
    for rank in range(3):
        resumed = torch.load(tmp_path / f"resumed_rank{rank}.pt")
        assert (resumed["steps"], resumed["position"], resumed["split"]) == (16, (2, 60), [4, 5, 6])
        assert _same(resumed["weights"], want["weights"]) and _same(resumed["momentum"], want["momentum"])
