"""One rank of ``hetero-strategy bench balance`` (started by the emulator, torchrun-style env).

Modes (each a separate launch, so every mode starts from the same state):

* ``solo`` — this rank's speed in the same Lightning training loop run as a single process (no
  communication; both ranks run at once, each on its own core, as in training), then the bare
  all-reduce of a tensor the size of the model's gradient over gloo (t_ar).
* ``ddp`` / ``hetero`` / ``hetero_cal`` / ``hetero_auto`` — Lightning training with ``strategy="ddp"``,
  ``HeteroStrategy()`` (static probe), ``HeteroStrategy(batch_sizes=[B]*N, calibrate=True)`` or
  ``HeteroStrategy(calibrate=True)`` (probe, then calibration; what ``make demo`` runs);
  every rank records the start time of each step, its batch size and (hetero) its compute time.
* ``split`` — ``HeteroStrategy(batch_sizes=--sizes)``: one fixed split of the benchmark's sweep.
* ``ddp_powersgd`` — Lightning ``DDPStrategy`` with PyTorch's own ``powerSGD_hook`` (equal batches).
* ``hetero_tiered`` — ``HeteroStrategy(compression="tiered")`` with the static probe.

Example::

    python -m hetero_strategy.benchmarks_impl.balance_worker --mode ddp --steps 30 --out /tmp/ddp
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import statistics
import time
from pathlib import Path

import lightning as L
import torch

from hetero_strategy.benchmarks_impl.balance_summary import MODELS, TRAININGS

__all__ = ["MODELS", "MODES", "main", "resnet18_32"]


_OVERLAP = {"on": True, "off": False}
MODES = ("solo", "split", *TRAININGS)


def _train_data(batch: int, world: int, steps: int):
    """Digits upsampled to 32x32, repeated so one epoch covers the run (no epoch-boundary stalls)."""
    from torch.utils.data import TensorDataset

    from hetero_strategy.workloads.digits import digits_datasets

    train, _ = digits_datasets(size=32)
    x, y = train.tensors
    reps = max(1, -(-(steps + 2) * batch * world // len(y)))
    return TensorDataset(x.repeat(reps, 1, 1, 1), y.repeat(reps))


def resnet18_32(model: str = "resnet18") -> torch.nn.Module:
    """torchvision ResNet-18 with its own stem (7x7/2 + max-pool) on 1-channel 32x32 digits.

    NOTE: the CIFAR-style stem (3x3/1, no pool) costs 16x the FLOPs at 32x32; this is the model
    the issue's anchor (0.33 s per step at batch 128 on one core) was measured with.
    ``resnet18_l3`` drops layer4: at 32x32 input layer4 runs on 1x1 maps, so it holds 75% of the
    parameters (8.4 of 11.2 M) but little of the compute. Its 2.8 M-parameter gradient makes a
    100 Mbit link cost about 1 s a step instead of 3.6 s, so a 4-rank mixed-link run fits in minutes.
    """
    import torchvision

    torch.manual_seed(0)
    net = torchvision.models.resnet18(num_classes=10)
    net.conv1 = torch.nn.Conv2d(1, 64, kernel_size=7, stride=2, padding=3, bias=False)
    if model == "resnet18_l3":
        net.layer4 = torch.nn.Identity()
        net.fc = torch.nn.Linear(256, 10)
    return net


_LAUNCHER_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
                 "ROLE_WORLD_SIZE", "TORCHELASTIC_RUN_ID")


def _solo(args: argparse.Namespace) -> dict:
    """This rank's solo training speed (the same Lightning loop, one process), then t_ar."""
    import torch.distributed as dist

    # Lightning must see a single-process run: hide the launcher's variables for the solo fit.
    saved = {k: os.environ.pop(k) for k in _LAUNCHER_ENV if k in os.environ}
    try:
        solo = _fit("solo", args, world=1)
    finally:
        os.environ.update(saved)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=300))
    grad = torch.zeros(sum(p.numel() for p in resnet18_32(args.model).parameters()))  # (P,) the whole gradient
    ar = []
    for i in range(args.ar_reps + 1):
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(grad)
        if i >= 1:  # the first call sets up gloo's buffers
            ar.append(time.perf_counter() - t0)
    dist.destroy_process_group()
    solo.update(t_ar_s=statistics.median(ar), ar_times=ar, grad_bytes=grad.numel() * 4)
    return solo


def _fit(mode: str, args: argparse.Namespace, world: int) -> dict:
    from torch.utils.data import DataLoader

    from hetero_strategy import HeteroStrategy
    from hetero_strategy.workloads.digits import DigitsClassifier

    L.seed_everything(0, verbose=False)
    clock = _StepClock()
    steps = args.solo_steps if mode == "solo" else args.steps
    if mode == "solo":
        strategy = "auto"
    elif mode == "ddp":
        strategy = "ddp"
    elif mode == "ddp_powersgd":
        strategy = _powersgd_ddp()
    elif mode in ("hetero", "hetero_tiered", "split"):
        kw = {"compression": "tiered"} if mode == "hetero_tiered" else {}
        if mode == "split":
            kw["batch_sizes"] = [int(b) for b in args.sizes.split(",")]
        strategy = HeteroStrategy(overlap_comm=_OVERLAP[args.overlap_comm], **kw)
    else:
        start = {} if mode == "hetero_auto" else {"batch_sizes": [args.batch] * world}
        strategy = HeteroStrategy(**start, calibrate=True, cold_start_steps=args.cold_start,
                                  overlap_comm=_OVERLAP[args.overlap_comm],
                                  recalibrate_every=args.recalibrate_every, window=args.window)
    trainer = L.Trainer(accelerator="cpu", devices=world, strategy=strategy, max_steps=steps, logger=False,
                        enable_checkpointing=False, enable_progress_bar=args.progress, enable_model_summary=False,
                        num_sanity_val_steps=0, limit_val_batches=0, callbacks=[clock])
    loader = DataLoader(_train_data(args.batch, world, steps), batch_size=args.batch, shuffle=True,
                        drop_last=True)
    model = DigitsClassifier(arch="mlp", lr=args.lr)
    model.net = resnet18_32(args.model)
    trainer.fit(model, loader)
    out = {"mode": mode, "starts": clock.starts, "batches": clock.batches, "compute_s": clock.compute_s}
    if args.accuracy:
        out["accuracy"] = _test_accuracy(model)
    if mode.startswith("hetero") or mode == "split":
        out["strategy_compute_s"] = [c for c, _ in trainer.strategy.timer.history]
        balancer = getattr(trainer.strategy, "balancer", None)
        if balancer is not None:
            out["decisions"] = balancer.calibrator.decisions
        out["final_sizes"] = list(trainer.strategy.sampler.batch_sizes)
    return out


def _powersgd_ddp():
    """Plain Lightning DDP with PyTorch's PowerSGD hook at the project's default rank (the baseline)."""
    from lightning.pytorch.strategies import DDPStrategy
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    from hetero_strategy.config.compression import CompressionConfig

    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=CompressionConfig().powersgd_rank,
                                   start_powerSGD_iter=2)
    return DDPStrategy(ddp_comm_state=state, ddp_comm_hook=powersgd.powerSGD_hook)


def _test_accuracy(model: L.LightningModule) -> float:
    """Accuracy on the digits test split (the same 32x32 upsampling), evaluated by each rank alone."""
    from hetero_strategy.workloads.digits import digits_datasets

    _, test = digits_datasets(size=32)
    x, y = test.tensors
    model.eval()
    with torch.no_grad():
        pred = torch.cat([model(x[i:i + 256]).argmax(dim=1) for i in range(0, len(y), 256)])
    return float((pred == y).float().mean())


class _StepClock(L.Callback):
    """Per training step on this rank: start time, local batch size and compute time.

    Compute ends when autograd has produced the gradient of the model's first layer (the last
    gradient of backward): DDP's all-reduce only waits after that, so the span excludes waiting
    for peers. The same clock serves plain DDP, hetero and solo runs (a tensor hook changes none).
    """

    def __init__(self) -> None:
        self.starts: list[float] = []
        self.batches: list[int] = []
        self.compute_s: list[float] = []
        self._grad_time: float | None = None

    def on_fit_start(self, trainer, pl_module) -> None:
        first = next(p for p in pl_module.parameters() if p.requires_grad)
        first.register_hook(self._grad_ready)

    def _grad_ready(self, grad: torch.Tensor) -> None:
        self._grad_time = time.perf_counter()

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx) -> None:
        self.starts.append(time.perf_counter())
        self.batches.append(len(batch[0]))
        self._grad_time = None

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        end = self._grad_time if self._grad_time is not None else time.perf_counter()
        self.compute_s.append(end - self.starts[-1])

    def on_train_end(self, trainer, pl_module) -> None:
        self.starts.append(time.perf_counter())  # closes the last step


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--mode", choices=MODES, required=True)
    p.add_argument("--out", required=True, help="directory; this rank writes <mode>_r<RANK>.json there")
    p.add_argument("--batch", type=int, default=128)
    p.add_argument("--sizes", default=None, help="split mode: the per-rank batch sizes, e.g. 180,76")
    p.add_argument("--model", choices=MODELS, default="resnet18")
    p.add_argument("--steps", type=int, default=30)
    p.add_argument("--solo-steps", type=int, default=12)
    p.add_argument("--ar-reps", type=int, default=5)
    p.add_argument("--cold-start", type=int, default=5)
    p.add_argument("--recalibrate-every", type=int, default=10)
    p.add_argument("--window", type=int, default=20)
    p.add_argument("--lr", type=float, default=0.02)
    p.add_argument("--progress", action="store_true", help="show Lightning's progress bar")
    p.add_argument("--overlap-comm", choices=tuple(_OVERLAP), default="on", help="hetero: overlap_comm")
    p.add_argument("--accuracy", action="store_true", help="report test accuracy after training")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    result = _solo(args) if args.mode == "solo" else _fit(args.mode, args, world)
    result["rank"] = int(os.environ.get("RANK", "0"))
    Path(args.out, f"{args.mode}_r{result['rank']}.json").write_text(json.dumps(result))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
