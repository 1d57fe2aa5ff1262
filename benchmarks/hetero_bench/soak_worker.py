"""One rank of ``bench soak``: an MLP on digits on bare DDP + HeteroRuntime, calibrating online.

argv: out_dir steps batch hidden. Each rank writes ``soak_r<rank>.json``: per step its wall-clock
start (``time.time()``, to line up with the driver's flap times), compute time and batch size.
Rank 0 also writes ``progress`` (the steps done) every 5 steps, which the driver flaps the link by.
"""

from __future__ import annotations

import json
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader

from hetero_bench._ranks import gloo_job
from hetero_strategy.config import HeteroConfig
from hetero_strategy.runtime import HeteroRuntime
from hetero_strategy.workloads.digits import digits_datasets


def _job(out: Path, steps: int, batch: int, hidden: int) -> dict:
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                        nn.Linear(hidden, 10))
    model = DistributedDataParallel(net)
    config = HeteroConfig.from_flat(calibrate=True, cold_start_steps=5, recalibrate_every=20, window=20,
                                    stall_timeout_s=120)
    runtime = HeteroRuntime(config, rank, world)
    train, _ = digits_datasets()
    loss_of = lambda m, b: nn.functional.cross_entropy(m(b[0]), b[1])
    loader = runtime.train_loader(DataLoader(train, batch_size=batch, shuffle=True, drop_last=True), seed=0,
                                  measure=None)
    runtime.register_hook(model, max_steps=steps)
    opt = torch.optim.SGD(model.parameters(), lr=0.05)
    starts, compute, sizes = [], [], []
    epoch = 0
    while runtime.steps < steps:
        loader.batch_sampler.set_epoch(epoch)
        for b in loader:
            starts.append(time.time())
            runtime.batch_start()
            with runtime.phase("exchange"):
                loss_of(model, b).backward()
            runtime.backward_end()
            runtime.optimizer_step(opt)
            opt.zero_grad(set_to_none=True)
            runtime.step_end()
            compute.append(runtime.timer.compute_time)
            sizes.append(runtime.local_batch)
            if rank == 0 and runtime.steps % 5 == 0:
                (out / "progress").write_text(str(runtime.steps))
            if runtime.steps >= steps:
                break
        epoch += 1
    starts.append(time.time())
    runtime.close()
    (out / f"soak_r{rank}.json").write_text(json.dumps({"starts": starts, "compute_s": compute, "batches": sizes}))
    return {}


def main() -> int:
    out, steps, batch, hidden = Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    return gloo_job(str(out / "unused.json"), lambda: _job(out, steps, batch, hidden))


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
