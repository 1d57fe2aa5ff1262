"""One rank of ``bench balance --sharded``: plain FSDP2 (even batches) or ``hetero_fsdp`` on a conv net
whose activations dominate its memory, so a rank's memory limit binds on its batch.

    python -m hetero_bench.sharded_worker --mode fsdp|hetero_fsdp --out DIR --batch B --steps N --measure M

Each rank writes ``DIR/<mode>_r<rank>.json``: samples/s over the last M steps (the global batch over
the wall time of those steps), its batch share, its passes per step, and the runtime's memory
probe and caps.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

MODES = ("fsdp", "hetero_fsdp")


def conv_net(width: int = 32) -> nn.Module:
    """Three 3x3 convolutions of ``width`` channels: the activations grow with the image, 20k parameters."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(3, width, 3, padding=1), nn.ReLU(), nn.Conv2d(width, width, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(width, width, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, 10))


class Net(L.LightningModule):
    def __init__(self, shard_itself: bool) -> None:
        super().__init__()
        self.net, self.shard_itself = conv_net(), shard_itself
        self.passes = 0

    def configure_model(self) -> None:
        if self.shard_itself:  # plain FSDP2 as Lightning's ModelParallelStrategy asks for it
            from torch.distributed.fsdp import fully_shard

            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        self.passes += 1
        x, y = batch
        return nn.functional.cross_entropy(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Clock(L.Callback):
    def __init__(self) -> None:
        self.ends: list[float] = []

    def on_train_start(self, trainer, module) -> None:
        module.passes = 0  # the start-up probe's calls are not training passes

    def on_train_batch_end(self, *args) -> None:
        self.ends.append(time.perf_counter())


def fit(mode: str, args: argparse.Namespace, world: int) -> dict:
    from lightning.pytorch.strategies import ModelParallelStrategy

    from hetero_strategy import HeteroFSDPStrategy

    L.seed_everything(0, verbose=False)
    g = torch.Generator().manual_seed(0)
    n = args.batch * world * (args.steps + 2)
    data = TensorDataset(torch.randn(n, 3, args.size, args.size, generator=g), torch.randint(0, 10, (n,), generator=g))
    strategy = ModelParallelStrategy(data_parallel_size=world, tensor_parallel_size=1) if mode == "fsdp" else \
        HeteroFSDPStrategy(memory_margin=args.memory_margin, probe_steps=args.probe_steps)
    clock, model = Clock(), Net(shard_itself=mode == "fsdp")
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=args.steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock])
    trainer.fit(model, DataLoader(data, batch_size=args.batch, shuffle=False, drop_last=True))
    ends = clock.ends[-(args.measure + 1):]
    out = {"mode": mode, "samples_per_s": args.batch * world * (len(ends) - 1) / (ends[-1] - ends[0]),
           "passes_per_step": model.passes / args.steps, "batch_sizes": [args.batch] * world}
    runtime = getattr(trainer.strategy, "_runtime", None)
    if runtime is not None:
        out["batch_sizes"] = runtime.sampler.batch_sizes
        out["memory_caps"] = runtime.state.memory_caps
        probe = runtime.state.memory_probe or []
        out["memory_probe"] = [None if m is None else [m.fixed_bytes, m.per_sample_bytes, m.limit_bytes]
                               for m in probe]
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="sharded_worker")
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", type=Path, required=True)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--steps", type=int, default=12)
    p.add_argument("--measure", type=int, default=8)
    p.add_argument("--memory-margin", type=float, default=0.03)
    p.add_argument("--size", type=int, default=96, help="image side: activations grow with its square")
    p.add_argument("--probe-steps", type=int, default=None, help="hetero_fsdp's probe_steps (default: the config's)")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    out = fit(args.mode, args, world)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / f"{args.mode}_r{rank}.json").write_text(json.dumps(out))
    return 0


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
