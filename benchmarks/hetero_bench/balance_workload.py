"""What both of ``bench balance``'s training loops share: data, model, hetero options, the bare loop.

Plain PyTorch: the bare-DDP loop (:mod:`.balance_fit_ddp`) must not pay for importing Lightning
(about 12 s of CPU, 50 s for a rank held to a quarter of a core).
"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Callable, Iterable
from typing import Any

import torch

__all__ = ["bench_model", "hetero_options", "parse_sizes", "powersgd_state", "run_loop", "runtime_record", "stepper",
           "test_accuracy", "train_data"]


def train_data(batch: int, world: int, steps: int) -> torch.utils.data.TensorDataset:
    """Digits upsampled to 32x32, repeated so one epoch covers the run (no epoch-boundary stalls)."""
    from hetero_strategy.workloads.digits import covering, digits_datasets

    train, _ = digits_datasets(size=32)
    return covering(train, (steps + 2) * batch * world)


def bench_model(model: str = "resnet18") -> torch.nn.Module:
    """``--model``: ResNet-18 with torchvision's stem on 32x32 digits; ``resnet18_l3`` without layer4
    (:func:`~hetero_strategy.workloads.resnets.resnet18_imagenet_stem`)."""
    from hetero_strategy.workloads.resnets import resnet18_imagenet_stem

    return resnet18_imagenet_stem(without_layer4=model == "resnet18_l3")


def hetero_options(mode: str, args: argparse.Namespace, world: int) -> dict[str, Any]:
    """The flat options of a hetero mode: ``HeteroStrategy(**o)`` or ``HeteroConfig.from_flat(**o)``."""
    opts: dict[str, Any] = {"overlap_comm": args.overlap_comm == "on"}
    planned = _planned(getattr(args, "plan_sizes", None) or [])
    if mode in planned:  # bench plan: the split `hetero-strategy plan` gave this method, not the probe's
        opts["batch_sizes"] = planned[mode]
    if mode in ("hetero_tiered", "hetero_codec"):
        # The measured window (the last --measure steps) holds compressed steps only: the dense
        # warm-up ends where it starts (at least 2 steps, as PowerSGD's start_powerSGD_iter), and
        # the density decays over twice the window, so the window sees the first half of the cosine
        # (at --steps 20 --measure 10 these are the defaults: warm-up 10, period 20 = max_steps).
        opts.update(compression="tiered" if mode == "hetero_tiered" else "auto",
                    dense_warmup_steps=max(2, args.steps - args.measure), density_period=2 * args.measure)
    elif mode == "split":
        opts["batch_sizes"] = [int(b) for b in args.sizes.split(",")]
    elif mode in ("hetero_cal", "hetero_auto"):
        if mode == "hetero_cal":  # from equal shares; hetero_auto starts from the probe's plan
            opts["batch_sizes"] = [args.batch] * world
        opts.update(calibrate=True, cold_start_steps=args.cold_start, recalibrate_every=args.recalibrate_every,
                    window=args.window)
    return opts


def parse_sizes(text: str) -> list[int] | None:
    """``"52,12"`` -> [52, 12]; None unless every entry is a whole number >= 1 (the caller names its flag)."""
    try:
        values = [int(b) for b in text.split(",")]
    except ValueError:
        return None
    return values if values and min(values) >= 1 else None


def _planned(entries: list[str]) -> dict[str, list[int]]:
    """``--plan-sizes MODE=B0,B1,...`` entries by mode; refused unless MODE is a static hetero mode
    (the calibrated ones start from their own split) and every size a whole number >= 1."""
    out = {}
    for entry in entries:
        mode, _, sizes = entry.partition("=")
        values = parse_sizes(sizes)
        if mode not in ("hetero", "hetero_codec", "hetero_tiered") or values is None:
            raise ValueError(f"--plan-sizes={entry!r} is invalid: give MODE=B0,B1,... with MODE one of hetero, "
                             "hetero_codec, hetero_tiered and each size >= 1, e.g. hetero=52,12")
        out[mode] = values
    return out


def powersgd_state() -> Any:
    """PyTorch's own PowerSGD state at the project's default rank (the baseline's hook state)."""
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd

    from hetero_strategy.config.compression import CompressionConfig

    return powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=CompressionConfig().powersgd_rank,
                                  start_powerSGD_iter=2)


def test_accuracy(net: torch.nn.Module) -> float:
    """Accuracy on the digits test split (the same 32x32 upsampling), evaluated by each rank alone."""
    from hetero_strategy.workloads.digits import accuracy, digits_datasets

    return accuracy(net, digits_datasets(size=32)[1])


def stepper(model: torch.nn.Module, loader: Iterable, loss_of: Callable[[Any], torch.Tensor],
            opt: torch.optim.Optimizer, clock: Any, runtime: Any = None,
            count_of: Callable[[Any], int] = lambda b: len(b[-1])) -> Callable[[int], None]:
    """One plain training step per call (with the step's index), wired to the hetero runtime as its
    docs ask of a bare-DDP loop (``batch_start`` / ``backward_end`` / ``step_end``). The data must
    cover every step taken."""
    batches = iter(loader)

    def step(i: int) -> None:
        batch = next(batches)
        if runtime is not None:
            runtime.batch_start()
        clock.batch_start(count_of(batch))
        with runtime.autocast() if runtime is not None else contextlib.nullcontext():
            loss = loss_of(batch)
        loss.backward()
        if runtime is not None:
            runtime.backward_end()
        opt.step()
        opt.zero_grad(set_to_none=True)
        clock.batch_end()
        if runtime is not None:
            runtime.step_end(i)
    return step


def run_loop(model: torch.nn.Module, loader: Iterable, loss_of: Callable[[Any], torch.Tensor], steps: int,
             opt: torch.optim.Optimizer, clock: Any, runtime: Any = None,
             count_of: Callable[[Any], int] = lambda b: len(b[-1])) -> None:
    """``steps`` steps of :func:`stepper`, then the clock's close."""
    step = stepper(model, loader, loss_of, opt, clock, runtime, count_of)
    for i in range(steps):
        step(i)
    clock.close()


def runtime_record(runtime: Any) -> dict[str, Any]:
    """The hetero runtime's view of the run (empty without one): its compute times, decisions, sizes."""
    if runtime is None:
        return {}
    out: dict[str, Any] = {"strategy_compute_s": [c for c, _ in runtime.timer.history],
                           "final_sizes": list(runtime.sampler.batch_sizes)}
    if runtime.balancer is not None:
        out["decisions"] = runtime.balancer.calibrator.decisions
        out["after_backward_s"] = runtime.balancer.calibrator.after_backward()  # a_r of its last window
    decision = getattr(runtime.hook_state, "decision", None)  # compression="auto": the codec it chose
    if decision is not None:
        from hetero_strategy.hooks.auto import Candidate

        out["codec"] = Candidate(decision.codec, decision.density, decision.rank).label
    return out
