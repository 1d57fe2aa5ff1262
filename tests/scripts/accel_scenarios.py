"""Accelerate scenarios for tests/test_accelerate.py, run as a user would: under `accelerate launch`.

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 accel_scenarios.py GROUP OUT_DIR [CKPT]

GROUP ``exact`` runs the exactness scenarios on one Accelerator (fp32); ``bf16`` one run under
``mixed_precision="bf16"``; ``policy`` one run with ``precision_policy=["bf16", "fp32"]``; ``ckpt_save`` trains, saves state mid-run and trains on; ``ckpt_load``
restores that state in a fresh launch and trains the same steps. Each rank writes OUT_DIR/rank<r>.pt.
"""

from __future__ import annotations

import faulthandler
import gc
import sys
import time
from pathlib import Path

import torch
from accelerate import Accelerator
from accelerate.tracking import GeneralTracker
from torch import nn
from torch.utils.data import DataLoader

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from oracle import make_data, make_net

from hetero_strategy.accelerate import HeteroPlugin

# name: (n samples, shuffle, drop_last, optimizer steps, accumulate, clip, StepLR (step_size, gamma), plugin kwargs)
EXACT = {
    "shuffle_uneven_last": (70, True, False, 5, 1, None, None, {}),
    "accumulate_clip_steplr": (96, True, True, 6, 2, 0.05, (2, 0.5), {}),
    # compute made proportional to the batch (see fit), so the calibrator really moves 3/13 toward 8/8
    "two_epochs_calibrated": (96, True, False, 12, 1, None, None, dict(calibrate=True, cold_start_steps=1,
                                                                       recalibrate_every=6, window=20)),
    # rank 1's loss is NaN at optimizer step 2: every rank drops that step (nonfinite="skip")
    "nan_skipped": (70, True, False, 5, 1, None, None, dict(nan_at=2)),
    # rank 1's share of 13 runs as passes of 5, 4 and 4 (cap 5), under accumulation and clipping
    "micro_accumulate_clip": (96, True, True, 6, 2, 0.05, (2, 0.5), dict(max_batch_sizes=[16, 5])),
}


class ListTracker(GeneralTracker):
    """Keeps what accelerator.log sends (the main process only, as Accelerate's trackers do)."""

    name = "list"
    requires_logging_directory = False

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict]] = []

    @property
    def tracker(self) -> list:
        return self.rows

    def log(self, values: dict, step: int | None = None, **kwargs) -> None:
        self.rows.append((step, dict(values)))


def fit(accelerator: Accelerator, spec: tuple, compression: str = "none", save_at: int | None = None,
        ckpt: str | None = None, load: bool = False) -> dict:
    n, shuffle, drop_last, steps, accumulate, clip, step_lr, extra = spec
    accelerator.gradient_accumulation_steps = accumulate
    net = make_net()
    opt = torch.optim.SGD(net.parameters(), lr=0.1)
    objects = [net, opt, DataLoader(make_data(n), batch_size=8, shuffle=shuffle, drop_last=drop_last)]
    if step_lr is not None:
        objects.append(torch.optim.lr_scheduler.StepLR(opt, step_size=step_lr[0], gamma=step_lr[1]))
    nan_at = extra.get("nan_at")
    plugin = HeteroPlugin(batch_sizes=[3, 13], compression=compression, log_every_n_steps=1,
                          **{k: v for k, v in extra.items() if k != "nan_at"})
    model, opt, loader, *rest = plugin.prepare(accelerator, *objects)
    sched = rest[0] if rest else None
    out: dict = {"seen": [], "lrs": [], "states": {},
                 "dtype": None if plugin.runtime.precision is None else plugin.runtime.precision.dtype}
    done, epoch = 0, 0
    if load:
        accelerator.load_state(ckpt)
        done, epoch = save_at, save_at // len(loader)  # saved at an epoch boundary: go on with the next epoch
        loader.set_epoch(epoch)
        out["states"]["loaded"] = plugin.hook_state.state_dict()
    while done < steps:
        for x, y in loader:
            with accelerator.accumulate(model):
                out["seen"].append(len(x))
                if plugin.config.calibration.calibrate:
                    time.sleep(0.004 * len(x))  # a per-sample cost the calibrator can see
                if extra.get("precision_policy"):  # hetero picks each rank's dtype and scales fp16
                    with plugin.autocast():
                        pred = model(x).squeeze(1)
                    plugin.backward(nn.functional.mse_loss(pred.float(), y))
                elif extra.get("max_batch_sizes"):  # the plugin runs the share as passes within the cap
                    for px, py in plugin.micro_batches((x, y)):
                        out.setdefault("passes", []).append(len(px))
                        plugin.backward(nn.functional.mse_loss(model(px).squeeze(1), py))
                else:
                    loss = nn.functional.mse_loss(model(x).squeeze(1), y)
                    if done == nan_at and accelerator.process_index == 1:
                        loss = loss * float("nan")
                    accelerator.backward(loss)
                if clip is not None and accelerator.sync_gradients:  # clip the reduced gradient only
                    accelerator.clip_grad_norm_(model.parameters(), clip)
                opt.step()
                if sched is not None:
                    sched.step()
                opt.zero_grad()
            if accelerator.sync_gradients:
                done += 1
                out["lrs"].append(opt.param_groups[0]["lr"])
                if done == save_at and not load:
                    out["states"]["saved"] = plugin.hook_state.state_dict()
                    accelerator.save_state(ckpt)
            if done == steps:
                break
        epoch += 1
    out["weights"] = [p.detach().clone() for p in accelerator.unwrap_model(model).parameters()]
    out["final_hook_state"] = plugin.hook_state.state_dict()
    out["batch_sizes"] = plugin.batch_sizes
    out["skipped"] = plugin.runtime.gate.guard.skipped
    if plugin.runtime.balancer is not None:
        out["decisions"] = plugin.runtime.balancer.calibrator.decisions
    return out


def main() -> None:
    faulthandler.enable()  # a native abort in a rank shows its Python stack in the test's report
    group, out_dir = sys.argv[1], Path(sys.argv[2])
    ckpt = sys.argv[3] if len(sys.argv) > 3 else None
    tracker = ListTracker()
    accelerator = Accelerator(cpu=True, log_with=[tracker], mixed_precision="bf16" if group == "bf16" else "no")
    accelerator.init_trackers("hetero-test")
    result: dict = {"distributed_type": str(accelerator.distributed_type), "world": accelerator.num_processes}
    if group == "exact":
        result.update({name: fit(accelerator, spec) for name, spec in EXACT.items()})
    elif group == "bf16":
        result["bf16"] = fit(accelerator, EXACT["shuffle_uneven_last"])
    elif group == "policy":  # rank 0 autocasts in bf16, rank 1 stays fp32 (precision_policy)
        spec = (*EXACT["shuffle_uneven_last"][:7], dict(precision_policy=["bf16", "fp32"]))
        result["policy"] = fit(accelerator, spec)
    elif group in ("ckpt_save", "ckpt_load"):
        # 48 samples: 3 steps an epoch; Top-K from step 2 on, so residuals exist when saving at step 3.
        spec = (48, True, False, 6, 1, None, None, dict(dense_warmup_steps=2, base_density=0.1, dense_fallback=False))
        result["ckpt"] = fit(accelerator, spec, compression="topk", save_at=3, ckpt=ckpt,
                             load=group == "ckpt_load")
    result["logged"] = tracker.rows
    torch.save(result, out_dir / f"rank{accelerator.process_index}.pt")
    # NOTE: free the DDP models now: objects kept alive by reference cycles until interpreter
    # finalization can still hold gloo work whose release then aborts the process (SIGABRT,
    # "terminate called without an active exception"; see pytorch/pytorch#179291).
    accelerator.free_memory()
    gc.collect()
    accelerator.end_training()


if __name__ == "__main__":
    main()
