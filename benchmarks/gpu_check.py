"""One script for a lent GPU: everything that needs CUDA, checked and timed, into one JSON.

Sections (each one runs even if another failed; its error is kept in the JSON):

* ``kernels`` — ``bench_kernels.py`` at 25M entries and k = 1% (Triton vs ``torch.topk`` + scatter,
  bitwise-checked against the reference first);
* ``hooks`` — every comm hook (none, fp16, bf16, powersgd, topk, tiered, onebit, topk pipelined)
  through DDP on this device as a world of 1 (NCCL on CUDA; the collectives really run): steps
  run, gradients finite, with density 1 equal to the plain gradient, the ``*_side`` variants
  (``side_streams=True``) bitwise equal to their plain twins, and on CUDA one more step under
  ``torch.cuda.set_sync_debug_mode("error")`` (``host_sync_free``: no host sync in the step) and
  one under ``torch.profiler``, counting the CUDA calls that block the host (``sync_calls``; the
  debug mode does not see event syncs): a hook of ours may make no more of them than plain DDP;
* ``autocast`` — bf16 and fp16 policies: forward/backward under autocast, loss scaling, dtypes;
  On CUDA the pipelined Top-K and onebit side variants run once more with the side stream
  sleeping ~10 ms per bucket (``*_delayed``), so a missing stream wait changes the gradients;
* ``overlap`` — CUDA only: step time of a 32-layer model, Top-K (4 stages) with and without side
  streams, alternating, medians, their ratio and the CPU time per step.

On CPU (``--device cpu``, gloo) it runs the same sections but kernels, which is how CI keeps
this script working without a GPU. Under 5 minutes on an H200.

Example::

    .venv/bin/python benchmarks/gpu_check.py --json benchmarks/results/gpu_check.json
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import sys
import time
import traceback
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn

HOOKS = {  # name: flat config fields
    "none": dict(compression="none"),
    "fp16": dict(compression="fp16"),
    "bf16": dict(compression="bf16"),
    "powersgd": dict(compression="powersgd"),
    "topk": dict(compression="topk", dense_fallback=False, dense_warmup_steps=1),
    "tiered": dict(compression="tiered", tiers=["eth1g"], dense_fallback=False, dense_warmup_steps=1),
    "onebit": dict(compression="onebit", dense_warmup_steps=1),
    "topk_pipelined": dict(compression="topk", dense_fallback=False, dense_warmup_steps=1, pipeline_stages=4),
    # one warm-up step of 4: the other three run the Top-K path at density 1
    "topk_density_1": dict(compression="topk", dense_fallback=False, base_density=1.0, min_density=1.0,
                           dense_warmup_steps=1),
}
SIDE = {f"{name}_side": dict(HOOKS[name], side_streams=True) for name in ("topk", "topk_pipelined", "onebit")}
DELAYED = ("topk_pipelined_side", "onebit_side")  # CUDA: run again with a sleeping side stream


def _section(report: dict, name: str, fn) -> None:
    t0 = time.perf_counter()
    try:
        report[name] = {"ok": True, **fn()}
    except Exception as e:  # noqa: BLE001 - NOTE: one broken section must not hide the others
        report[name] = {"ok": False, "error": f"{type(e).__name__}: {e}", "traceback": traceback.format_exc()}
    report[name]["seconds"] = time.perf_counter() - t0


def _kernels(device: torch.device) -> dict:
    if device.type != "cuda":
        return {"skipped": "no CUDA device: the kernels are timed on a GPU only"}
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_kernels

    args = bench_kernels.build_parser().parse_args(["--sizes", "2.5e7", "--densities", "0.01"])
    return bench_kernels.run(args)


def _net(device: torch.device) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(64, 256), nn.ReLU(), nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)).to(device)


def _steps(model: nn.Module, x: torch.Tensor, y: torch.Tensor, n: int, sync: bool = True) -> list[float]:
    """``n`` forward/backward passes; the time of each (device-synchronised on CUDA when ``sync``)."""
    times = []
    for _ in range(n):
        model.zero_grad()
        t0 = time.perf_counter()
        nn.functional.cross_entropy(model(x), y).backward()
        if sync and x.is_cuda:
            torch.cuda.synchronize(x.device)
        times.append(time.perf_counter() - t0)
    return times


def _ddp(net: nn.Module, fields: dict, device: torch.device, delay_side: bool = False) -> nn.Module:
    """DDP with the configured hook; ``delay_side``: the side stream first sleeps ~10 ms per
    bucket, so a missing wait after the side stream's work (NCCL's, the decode's or DDP's) changes
    the gradients."""
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.hooks import build_comm_hook

    model = DistributedDataParallel(net, device_ids=[device.index] if device.type == "cuda" else None)
    state, hook = build_comm_hook(HeteroConfig.from_flat(**fields), None, max_steps=10)
    if delay_side:
        run = state.streams.run
        state.streams.run = lambda buf, work: run(buf, lambda: (torch.cuda._sleep(20_000_000), work())[1])
    model.register_comm_hook(state, hook)
    return model


def _sync_free(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> dict:
    """One more step with host syncs made errors (CUDA only)."""
    if device.type != "cuda":
        return {}
    torch.cuda.set_sync_debug_mode("error")
    try:
        _steps(model, x, y, 1, sync=False)
        return {"host_sync_free": True}
    except RuntimeError as e:
        return {"host_sync_free": False, "host_sync": str(e).splitlines()[0]}
    finally:
        torch.cuda.set_sync_debug_mode(0)


SYNC_CALLS = ("cudaDeviceSynchronize", "cudaStreamSynchronize", "cudaEventSynchronize", "cudaMemcpy")


def _sync_calls(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> dict:
    """One more step under the profiler: how often each host-blocking CUDA call ran (CUDA only)."""
    if device.type != "cuda":
        return {}
    from torch.profiler import ProfilerActivity, profile

    try:
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            _steps(model, x, y, 1, sync=False)
        torch.cuda.synchronize(device)
        counts = {e.key: e.count for e in prof.key_averages() if e.key in SYNC_CALLS}
        return {"sync_calls": counts, "sync_calls_total": sum(counts.values())}
    except Exception as e:  # noqa: BLE001 - NOTE: a profiler failure is a finding, not the section's end
        return {"sync_calls_error": f"{type(e).__name__}: {e}"}


def _hooks(device: torch.device) -> dict:
    x = torch.randn(32, 64, device=device)
    y = torch.randint(0, 10, (32,), device=device)
    plain = _net(device)
    nn.functional.cross_entropy(plain(x), y).backward()
    want = [p.grad.clone() for p in plain.parameters()]
    out, grads = {}, {}
    for name, fields in {**HOOKS, **SIDE}.items():
        model = _ddp(_net(device), fields, device)
        times = _steps(model, x, y, 4)
        grads[name] = [p.grad.clone() for p in model.parameters()]
        row = {"finite": all(bool(torch.isfinite(g).all()) for g in grads[name]),
               "step_s": sorted(times)[len(times) // 2]}
        if name in ("none", "topk_density_1"):  # world of 1, density 1: the plain gradient
            row["equals_plain"] = all(torch.allclose(g, w, rtol=1e-5, atol=1e-6) for g, w in zip(grads[name], want))
        if name in SIDE:  # the same steps on a side stream: bitwise the plain path's gradients
            row["equals_plain_path"] = all(torch.equal(a, b) for a, b in zip(grads[name], grads[name[:-5]]))
        row.update(_sync_free(model, x, y, device) if fields.get("compression") != "none" else {})
        row.update(_sync_calls(model, x, y, device))
        out[name] = row
        if name in DELAYED and device.type == "cuda":
            model = _ddp(_net(device), fields, device, delay_side=True)
            _steps(model, x, y, 4)
            late = [p.grad for p in model.parameters()]
            out[f"{name}_delayed"] = {"finite": all(bool(torch.isfinite(g).all()) for g in late),
                                      "equals_plain_path": all(torch.equal(a, b) for a, b in zip(late, grads[name[:-5]]))}
    ours = ("topk", "tiered", "onebit")  # the hooks whose steps must not sync the host
    plain_syncs = out["none"].get("sync_calls_total", 0)  # what DDP itself blocks on in a step
    problems = [name for name, row in out.items() if not row["finite"] or False in (
        row.get("equals_plain"), row.get("equals_plain_path"),
        row.get("host_sync_free") if name.startswith(ours) else None)
        or (name.startswith(ours) and row.get("sync_calls_total", 0) > plain_syncs)]
    return {"backend": dist.get_backend(), "hooks": out, "problems": problems}


def _overlap(device: torch.device) -> dict:
    """Top-K's codec on a side stream against the compute stream, while backward still runs."""
    if device.type != "cuda":
        return {"skipped": "no CUDA device: side streams exist on a GPU only"}
    # 32 layers of 1M parameters: several per 25 MB bucket, so 4 stages really cut chunks
    width, depth, batch = 1024, 32, 4096
    x = torch.randn(batch, width, device=device)
    y = torch.randint(0, width, (batch,), device=device)
    base = dict(compression="topk", dense_fallback=False, dense_warmup_steps=1, pipeline_stages=4)
    models = {}
    for side in (False, True):
        torch.manual_seed(0)
        net = nn.Sequential(*[nn.Linear(width, width) for _ in range(depth)]).to(device)
        models[side] = _ddp(net, dict(base, side_streams=side), device)
        _steps(models[side], x, y, 3)  # warm-up, the bucket rebuild, Triton compiles
    times: dict[bool, list[float]] = {False: [], True: []}
    cpu: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(7):  # alternating rounds
        for side in (False, True):
            c0 = time.process_time()
            times[side] += _steps(models[side], x, y, 3)
            cpu[side].append((time.process_time() - c0) / 3)
    med = {side: sorted(t)[len(t) // 2] for side, t in times.items()}
    # NOTE: a CPU time per step near the step time means the hook's Python bounds the step, not the GPU
    return {"step_s_plain": med[False], "step_s_side_streams": med[True], "speedup": med[False] / med[True],
            "spread_s": {str(k): [min(v), max(v)] for k, v in times.items()},
            "cpu_s_per_step": {str(k): sorted(v)[len(v) // 2] for k, v in cpu.items()}}


def _autocast(device: torch.device) -> dict:
    from hetero_strategy.config import PrecisionConfig
    from hetero_strategy.precision import RankPrecision

    out = {}
    for dtype in ("bf16", "fp16"):
        rp = RankPrecision.build(PrecisionConfig(precision_policy=dtype), 0, 1, device)
        net = nn.Sequential(nn.Linear(64, 64), nn.LayerNorm(64), nn.Linear(64, 10)).to(device)
        rp.keep_fp32(net)
        opt = torch.optim.SGD(net.parameters(), lr=0.1)
        with rp.autocast():
            logits = net(torch.randn(16, 64, device=device))
        loss = nn.functional.cross_entropy(logits.float(), torch.randint(0, 10, (16,), device=device))
        rp.scaler.scale_loss(loss).backward()
        stepped = rp.scaler.step(opt)
        out[dtype] = {"logits_dtype": str(logits.dtype), "loss": float(loss.detach()), "scale": rp.scaler.scale,
                      "stepped": stepped, "param_dtype": str(next(net.parameters()).dtype)}
    return out


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="gpu_check")
    p.add_argument("--json", default="benchmarks/results/gpu_check.json")
    p.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = p.parse_args(argv)
    device = torch.device(args.device if args.device == "cpu" else "cuda:0")
    if device.type == "cuda":
        torch.cuda.set_device(device)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    dist.init_process_group("nccl" if device.type == "cuda" else "gloo", rank=0, world_size=1)
    report: dict = {"device": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu",
                    "capability": list(torch.cuda.get_device_capability(device)) if device.type == "cuda" else None,
                    "torch": torch.__version__}
    try:
        _section(report, "kernels", lambda: _kernels(device))
        _section(report, "hooks", lambda: _hooks(device))
        _section(report, "autocast", lambda: _autocast(device))
        _section(report, "overlap", lambda: _overlap(device))
    finally:
        dist.destroy_process_group()
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2, default=str))
    failed = [k for k, v in report.items() if isinstance(v, dict) and (v.get("ok") is False and "error" in v
                                                                       or v.get("problems"))]
    print(json.dumps({k: v.get("ok") for k, v in report.items() if isinstance(v, dict)}), "failed:", failed)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
