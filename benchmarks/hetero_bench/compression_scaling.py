"""``hetero-strategy bench compression-scaling``: bytes per rank per step against the world size.

1. Measured: each codec (dense fp32, fp16, ``topk``, ``topk_allreduce``, PowerSGD rank 4) at
   W = 2, 4 and 8 ranks of the emulated cluster (one network namespace and veth per rank, so each
   rank's interface transmit counter is its own), on the time-to-accuracy CNN. Compute speed does
   not change bytes, so every rank gets a whole core's quota and the links 1 Gbit/s.
2. Modelled: :func:`hetero_strategy.cluster.wire.bytes_per_rank` from the CNN's parameter
   shapes, with the transport's two numbers (bytes per payload byte, bytes per message) fitted on
   dense fp32 and PowerSGD at the smallest W, for W = 2 … 1024; its error against every other
   measured point.

Writes JSON ``{"bytes_per_rank_per_step": {codec: {W: bytes}}, "model_bytes_per_rank_per_step":
{codec: {W: bytes}}, "model_error": {codec: {W: relative error}}, "ratios": {...}, "setup":
{...}}`` and a PNG chart beside it.

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench compression-scaling --json benchmarks/results/compression_scaling.json
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
from pathlib import Path

from hetero_bench import RESULTS
from hetero_bench._ranks import worker
from hetero_strategy.commands.flags import count, output_file, rate

__all__ = ["MODEL_WORLDS", "add_arguments", "run", "summarise"]

_WORKER = "compression_scaling_worker"
MODEL_WORLDS = (2, 4, 8, 16, 32, 64, 128, 256, 512, 1024)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "compression_scaling.json"), help="where to write results")
    parser.add_argument("--worlds", nargs="+", type=count(2), default=[2, 4, 8], help="measured world sizes")
    parser.add_argument("--steps", type=count(1), default=10, help="counted steps per codec")
    parser.add_argument("--link", type=rate, default="1gbit", help="every rank's link rate (bytes do not depend on it)")
    parser.add_argument("--model", choices=["cnn", "resnet18"], default="cnn",
                        help="cnn: the time-to-accuracy CNN (283k parameters); resnet18: 11.2M")


def _measure(world: int, steps: int, link: str, tmp: str, model: str) -> dict:
    from hetero_strategy.emulate import EmulatedCluster

    out = str(Path(tmp) / f"w{world}.json")
    with EmulatedCluster(compute=[1.0] * world, links=[link] * world, measure=False) as cluster:
        result = cluster.run([*worker(_WORKER), "--out", out, "--steps", str(steps), "--model", model], timeout=900)
    if not result.ok:
        raise RuntimeError(f"scaling run at W={world} failed (rc {result.returncode}):\n"
                           + "\n".join(result.outputs)[-3000:])
    return json.loads(Path(out).read_text())


def summarise(measured: dict[int, dict], buckets: list[list[tuple[int, ...]]], density: float = 0.01,
              powersgd_rank: int = 4) -> dict:
    """Measured means over ranks, the framed model at every world size, the model's errors."""
    from hetero_strategy.cluster.wire import bytes_per_rank

    shapes = buckets
    codecs = list(next(iter(measured.values())))
    got = {c: {str(w): statistics.mean(measured[w][c]["wire_bytes_per_rank"]) for w in sorted(measured)}
           for c in codecs}
    hook = {c: {str(w): statistics.mean(measured[w][c]["hook_bytes_per_rank"]) for w in sorted(measured)}
            for c in codecs}
    w0 = min(measured)
    framing, per_message = fit_transport(got, shapes, w0, density, powersgd_rank)

    def model(c: str, w: int) -> float:
        return bytes_per_rank(c, shapes, w, density=density, powersgd_rank=powersgd_rank, framing=framing,
                              per_message=per_message)

    modelled = {c: {str(w): model(c, w) for w in sorted({*MODEL_WORLDS, *measured})} for c in codecs}
    errors = {c: {w: modelled[c][w] / got[c][w] - 1 for w in got[c]} for c in codecs}
    ratios = {f"{c}_bytes_w{max(measured)}_over_w{w0}": got[c][str(max(measured))] / got[c][str(w0)]
              for c in codecs}
    return {"bytes_per_rank_per_step": got, "hook_bytes_per_rank_per_step": hook,
            "model_bytes_per_rank_per_step": modelled, "model_error": errors,
            "max_abs_model_error": max(abs(e) for per in errors.values() for e in per.values()),
            "framing_factor": framing, "per_message_bytes": per_message, "fitted_on": f"dense and powersgd at W={w0}",
            "ratios": ratios}


def fit_transport(got: dict, shapes: list[list[tuple[int, ...]]], world: int, density: float,
                  powersgd_rank: int) -> tuple[float, float]:
    """(framing, per_message) solving the model = the measurement for dense (payload-heavy) and
    PowerSGD (message-heavy) at ``world``; framing alone from dense when PowerSGD was not run."""
    from hetero_strategy.cluster.wire import bytes_per_rank

    def parts(c: str) -> tuple[float, float]:  # (payload bytes, messages) per rank and step
        kw = dict(density=density, powersgd_rank=powersgd_rank)
        return (bytes_per_rank(c, shapes, world, framing=1.0, per_message=0.0, **kw),
                bytes_per_rank(c, shapes, world, framing=0.0, per_message=1.0, **kw))

    (pd, md), w = parts("dense"), str(world)
    if "powersgd" not in got:
        return got["dense"][w] / pd, 0.0
    pp, mp = parts("powersgd")
    det = pd * mp - pp * md
    framing = (got["dense"][w] * mp - got["powersgd"][w] * md) / det
    return framing, (pd * got["powersgd"][w] - pp * got["dense"][w]) / det


def _chart(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(7, 4.5))
    for c, per in result["model_bytes_per_rank_per_step"].items():
        ws = sorted(per, key=int)
        line, = ax.plot([int(w) for w in ws], [per[w] / 1e6 for w in ws], label=f"{c} (model)")
        got = result["bytes_per_rank_per_step"][c]
        ax.plot([int(w) for w in got], [v / 1e6 for v in got.values()], "o", color=line.get_color())
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("world size W (ranks)")
    ax.set_ylabel("MB sent per rank per step")
    ax.set_title("bytes per rank per step: measured (dots, emulated cluster) and modelled (lines)", fontsize=9)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def run(args: argparse.Namespace) -> int:
    from hetero_bench.compression_scaling_worker import make_model

    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    measured = {}
    with tempfile.TemporaryDirectory() as tmp:
        for w in sorted(set(args.worlds)):
            print(f"bench compression-scaling: W={w} on the emulated cluster ...", flush=True)
            measured[w] = _measure(w, args.steps, args.link, tmp, args.model)
    net = make_model(args.model)[0]
    buckets = next(iter(measured.values()))["dense"]["buckets"]  # DDP's layout after its rebuild
    result = summarise(measured, [[tuple(s) for s in b] for b in buckets])
    result["per_rank"] = {str(w): m for w, m in measured.items()}
    result["setup"] = {
        "workload": f"{args.model} ({sum(p.numel() for p in net.parameters())} parameters) in one DDP bucket, "
                    "batch 8 per rank of random inputs",
        "codecs": "dense fp32, fp16 (torch's hook), topk and topk_allreduce (density 0.01 constant, no dense "
                  "fallback), powersgd (torch's hook, rank 4, one bucket)",
        "measured": f"interface transmit bytes per rank per step, mean over ranks, {args.steps} steps after "
                    f"warm-up; W = {sorted(measured)} on the emulated cluster, {args.link} links",
        "model": "cluster/wire.bytes_per_rank with framing_factor and per_message_bytes fitted on dense and "
                 "powersgd at the smallest W",
    }
    out.write_text(json.dumps(result, indent=2))
    _chart(result, out.with_suffix(".png"))
    for c, per in result["bytes_per_rank_per_step"].items():
        errs = ", ".join(f"W={w}: {per[w] / 1e3:.1f} kB ({result['model_error'][c][w]:+.1%})" for w in per)
        print(f"  {c:15s} {errs}")
    return 0
