"""A peer frozen with SIGSTOP: every survivor raises StallError within stall_timeout_s + 10 s, naming
the frozen rank, the phase and the step (3 gloo ranks, bare DDP + HeteroRuntime)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest
import torch
from dist_utils import run_distributed

TIMEOUT_S = 5.0
FROZEN, FREEZE_STEP = 2, 3


def _train(rank: int, world_size: int, tmp: str) -> dict:
    import torch.distributed as dist
    from dist_utils import init_gloo
    from oracle import make_data, make_net
    from torch.nn.parallel import DistributedDataParallel
    from torch.utils.data import DataLoader

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime, StallError

    init_gloo(rank, world_size)  # a long default timeout (60 s): the runtime bounds it
    pids = [None] * world_size
    dist.all_gather_object(pids, os.getpid())
    net = make_net()
    model = DistributedDataParallel(net)
    runtime = HeteroRuntime(HeteroConfig.from_flat(batch_sizes=[4, 4, 4], stall_timeout_s=TIMEOUT_S), rank,
                            world_size)
    loader = runtime.train_loader(DataLoader(make_data(96), batch_size=4), seed=0)
    runtime.register_hook(model, max_steps=8)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    out: dict = {"pids": pids}
    try:
        for step, (x, y) in zip(range(8), loader):
            runtime.batch_start()
            loss = torch.nn.functional.mse_loss(model(x).squeeze(1), y)
            if rank == FROZEN and step == FREEZE_STEP:
                Path(tmp, "frozen_at").write_text(repr(time.time()))
                os.kill(os.getpid(), signal.SIGSTOP)  # frozen for good: a survivor kills it below
            with runtime.phase("exchange"):
                loss.backward()
            runtime.backward_end()
            runtime.optimizer_step(opt)
            opt.zero_grad(set_to_none=True)
            runtime.step_end(step)
    except StallError as e:
        out.update(error=str(e), at=time.time())
    # The survivors finish together (rank 0 hosts the store the other reads heartbeats from)
    Path(tmp, f"done{rank}").touch()
    deadline = time.monotonic() + 30
    while not all(Path(tmp, f"done{r}").exists() for r in range(world_size) if r != FROZEN):
        assert time.monotonic() < deadline, "the other survivor never finished"
        time.sleep(0.1)
    if rank == 0:
        os.kill(pids[FROZEN], signal.SIGKILL)  # no process left behind
    runtime.close()
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("stall")
    res = run_distributed(_train, 3, str(tmp), timeout=120, may_die=(FROZEN,))
    return res, float(Path(tmp, "frozen_at").read_text())


def test_every_survivor_names_the_frozen_rank_the_phase_and_the_step(results):
    res, _ = results
    assert res[FROZEN] is None  # killed while frozen
    for rank in (0, 1):
        message = res[rank].get("error")
        assert message is not None, f"rank {rank} trained on past a frozen peer"
        assert f"rank {FROZEN}" in message and "exchange of step 3" in message, message
        assert f"stall_timeout_s={TIMEOUT_S:g}" in message


def test_the_error_comes_within_the_bound_and_nothing_is_left_running(results):
    res, frozen_at = results
    for rank in (0, 1):
        assert res[rank]["at"] - frozen_at <= TIMEOUT_S + 10, "the stall error came too late"
    with pytest.raises(ProcessLookupError):
        os.kill(res[0]["pids"][FROZEN], 0)


def _bound_only_in_phases(rank: int, world_size: int) -> dict:
    import datetime

    import torch.distributed as dist
    from dist_utils import init_gloo
    from oracle import make_net
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime import HeteroRuntime
    from hetero_strategy.runtime.stall import group_timeout

    init_gloo(rank, world_size)  # 60 s, as a framework would set it
    runtime = HeteroRuntime(HeteroConfig.from_flat(batch_sizes=[4, 4], stall_timeout_s=1.0), rank, world_size)
    runtime.register_hook(DistributedDataParallel(make_net()))
    out = {}
    with runtime.phase("metrics"):
        out["inside"] = group_timeout(dist.group.WORLD)
    out["after"] = group_timeout(dist.group.WORLD)
    # a rank far behind outside any phase (a slow probe, an evaluation) is no stall
    if rank == 1:
        time.sleep(3.0)
    t = torch.ones(1)
    dist.all_reduce(t)
    out["sum"] = t.item()
    runtime.close()
    assert out["after"] == datetime.timedelta(seconds=60)
    return out


def test_the_bound_holds_inside_a_phase_only():
    import datetime

    for r in run_distributed(_bound_only_in_phases, 2, timeout=90):
        assert r["inside"] == datetime.timedelta(seconds=1.0) and r["sum"] == 2.0
