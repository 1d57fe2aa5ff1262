"""One rank of ``hetero-strategy bench compression-scaling``: bytes each codec puts on the wire.

Every codec trains the time-to-accuracy CNN (:func:`~hetero_bench.compression_e2e.make_cnn`), or
ResNet-18, in one DDP bucket on random inputs for a few untimed steps (warm-up, DDP's bucket rebuild, PowerSGD's start), then
``--steps`` counted steps. Counted: this rank's interface transmit counter (its own network
namespace on the emulated cluster) across those steps, and the bytes the hook says it sent.
Every rank's figures reach rank 0, which writes them.

Example (what the bench runs on every rank)::

    PYTHONPATH=benchmarks python -m hetero_bench.compression_scaling_worker --out /tmp/w4.json
"""

from __future__ import annotations

import argparse

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

from hetero_bench._ranks import gloo_job
from hetero_bench.compression_e2e import interface_tx_bytes, make_cnn
from hetero_bench.compression_worker import make_hook
from hetero_strategy.dist import all_gather_floats

__all__ = ["BENCH_METHOD", "main"]

# the scaling codec -> the compression bench's method of the same hook
BENCH_METHOD = {"dense": "ddp", "fp16": "ddp_fp16", "topk": "topk", "topk_allreduce": "topk_allreduce",
                "powersgd": "ddp_powersgd"}
WARMUP_STEPS = 4  # dense warm-up (1), DDP's rebuild (after 1), PowerSGD's dense start (2)
BUCKET_MB = 1000  # as few buckets as DDP allows (PowerSGD needs that on gloo); the model takes the layout


def make_model(name: str) -> tuple[nn.Module, tuple[int, ...]]:
    """(the model, one input's shape): the time-to-accuracy CNN, or torchvision's ResNet-18 with
    the CIFAR stem (11.2M parameters: payloads large beside the transport's per-message cost)."""
    if name == "cnn":
        return make_cnn(), (1, 8, 8)
    from hetero_strategy.workloads.resnets import resnet_cifar_stem

    return resnet_cifar_stem("resnet18", in_channels=3), (3, 32, 32)


def _measure(codec: str, steps: int, model_name: str = "cnn") -> dict:
    torch.manual_seed(0)
    state, hook, _ = make_hook(BENCH_METHOD[codec], steps=1000, warmup=1, fallback=False)
    net, shape = make_model(model_name)
    model = DDP(net, bucket_cap_mb=BUCKET_MB)
    layout: dict[int, list] = {}

    def recording(st, bucket):  # the layout the counted steps run (DDP rebuilds after step 1)
        layout[bucket.index()] = [tuple(p.shape) for p in bucket.parameters()]
        return hook(st, bucket)

    model.register_comm_hook(state, recording)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    gen = torch.Generator().manual_seed(dist.get_rank())
    x, y = torch.randn(8, *shape, generator=gen), torch.randint(0, 10, (8,), generator=gen)

    def step() -> int:
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
        return int(getattr(state, "last_bytes_sent", 0))

    for _ in range(WARMUP_STEPS):
        step()
    dist.barrier()
    tx0 = interface_tx_bytes()
    hook_bytes = sum(step() for _ in range(steps))
    agreement = getattr(getattr(state, "topk", None), "agreement", None)
    if agreement is not None:  # topk_allreduce: the next index set may still be on the wire
        agreement.collect()
    dist.barrier()  # a barrier's few bytes ride along in every codec alike
    wire = (interface_tx_bytes() - tx0) / steps
    rows = all_gather_floats([wire, hook_bytes / steps])
    return {"wire_bytes_per_rank": [r[0] for r in rows], "hook_bytes_per_rank": [r[1] for r in rows],
            "buckets": [layout[i] for i in sorted(layout)]}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="compression_scaling_worker")
    p.add_argument("--out", required=True, help="rank 0 writes its JSON here")
    p.add_argument("--codecs", nargs="+", default=list(BENCH_METHOD), choices=list(BENCH_METHOD))
    p.add_argument("--steps", type=int, default=10, help="counted steps per codec")
    p.add_argument("--model", choices=["cnn", "resnet18"], default="cnn")
    args = p.parse_args(argv)
    return gloo_job(args.out, lambda: {c: _measure(c, args.steps, args.model) for c in args.codecs}, timeout_s=600)


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
