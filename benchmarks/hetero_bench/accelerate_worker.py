"""One timed training run for ``hetero-strategy bench accelerate``, started by ``accelerate launch``.

    PYTHONPATH=benchmarks accelerate launch ... -m hetero_bench.accelerate_worker MODE MODEL STEPS BATCH OUT.json

MODE ``plain`` is Accelerate's own DDP (each rank batch B); ``hetero`` is the same loop through
``HeteroPlugin(batch_sizes=[B] * world)``: equal shares, so any difference is the plugin's cost
(sample-weighted hook, loader wrapper, timer). Rank 0 writes the step times.
"""

from __future__ import annotations

import gc
import json
import sys
import time

import torch
from torch import nn
from torch.utils.data import DataLoader

__all__ = ["main"]


def _model(name: str) -> nn.Module:
    if name == "resnet18":
        from hetero_strategy.workloads.resnets import resnet_cifar_stem

        return resnet_cifar_stem("resnet18")
    # a small MLP: per-step framework overhead weighs most where the compute is smallest
    return nn.Sequential(nn.Flatten(), nn.Linear(32 * 32, 256), nn.ReLU(), nn.Linear(256, 10))


def main(argv: list[str]) -> None:
    from accelerate import Accelerator

    from hetero_strategy.accelerate import HeteroPlugin
    from hetero_strategy.workloads.digits import digits_datasets

    mode, model_name, steps, batch, out = argv[0], argv[1], int(argv[2]), int(argv[3]), argv[4]
    torch.set_num_threads(1)
    accelerator = Accelerator(cpu=True)
    torch.manual_seed(0)
    train, _ = digits_datasets(size=32)
    net = _model(model_name)
    opt = torch.optim.SGD(net.parameters(), lr=0.05, momentum=0.9)
    loader = DataLoader(train, batch_size=batch, shuffle=True, drop_last=True)
    if mode == "hetero":
        plugin = HeteroPlugin(batch_sizes=[batch] * accelerator.num_processes)
        model, opt, loader = plugin.prepare(accelerator, net, opt, loader)
    else:
        model, opt, loader = accelerator.prepare(net, opt, loader)
    times: list[float] = []
    last = None
    while len(times) < steps:
        for x, y in loader:
            loss = nn.functional.cross_entropy(model(x), y)
            accelerator.backward(loss)
            opt.step()
            opt.zero_grad()
            now = time.perf_counter()
            if last is not None:
                times.append(now - last)
            last = now
            if len(times) == steps:
                break
    if accelerator.is_main_process:
        with open(out, "w") as f:
            json.dump({"mode": mode, "model": model_name, "step_s": times,
                       "global_batch": batch * accelerator.num_processes}, f)
    # NOTE: free the DDP model before the process group goes (pytorch/pytorch#179291)
    del model, opt, loader
    accelerator.free_memory()
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    main(sys.argv[1:])
    exit_now(0)  # results written: no finalization to abort in (dist/exit_guard.py)
