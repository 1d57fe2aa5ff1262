"""One rank of ``hetero-strategy bench overlap``: the Top-K hook's codec against its exchange.

On a synthetic bucket of ``--params`` parameters (``--numel`` entries in all), per round and for
each stage count in turn (the order rotates per round): the codec alone (encode every chunk and
store the residuals, send nothing), the exchange alone (those chunks' collectives and decode, no
codec), and the whole hook. Codec and exchange are timed at the hook's own chunking, so smaller
chunks' better cache use is not counted as overlap. Ranks meet at a barrier before each timing,
so every timing covers the same collective on both ranks.

Example (what each rank runs inside the emulated cluster)::

    PYTHONPATH=benchmarks python -m hetero_bench.overlap_worker --out /tmp/overlap.json
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist

from hetero_bench._ranks import gloo_job
from hetero_bench.flat_bucket import FlatBucket

__all__ = ["main"]


def _timed(fn) -> float:
    dist.barrier()
    t0 = time.perf_counter()
    fn()
    return time.perf_counter() - t0


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="overlap_worker")
    p.add_argument("--out", required=True)
    p.add_argument("--numel", type=int, default=1 << 24)
    p.add_argument("--params", type=int, default=16)
    p.add_argument("--density", type=float, default=0.01)
    p.add_argument("--stages", type=int, nargs="+", default=[1, 2, 4, 8])
    p.add_argument("--rounds", type=int, default=7)
    args = p.parse_args(argv)
    return gloo_job(args.out, lambda: _measure(args))


def _measure(args: argparse.Namespace) -> dict:
    from hetero_strategy.hooks import CompressedState
    from hetero_strategy.hooks.compressed_hooks import _compress
    from hetero_strategy.hooks.exchange import finish_exchange, issue_chunk
    from hetero_strategy.hooks.topk_ef import encode_chunks, store_residuals

    sizes = [args.numel // args.params] * args.params
    grad = torch.randn(sum(sizes), generator=torch.Generator().manual_seed(dist.get_rank()))
    params = [torch.empty(0) for _ in sizes]
    counts = sorted({1, *args.stages})  # the codec and exchange in one chunk are always timed
    states = {s: CompressedState(method="topk", dense_fallback=False, base_density=args.density,
                                 min_density=args.density, density_schedule="constant", dense_warmup_steps=1,
                                 dense_sync_every=0, pipeline_stages=s) for s in counts}

    # what pipeline_stages="auto" picks for this bucket, from the link and codec it measures (collective)
    auto = CompressedState(method="topk", base_density=args.density, min_density=args.density,
                           density_schedule="constant", dense_warmup_steps=1, dense_sync_every=0)
    auto_plan = auto.plan(1, sizes)
    auto_stages = auto.stages_for(sizes, auto_plan.sparse, auto_plan.caps)

    def bucket() -> FlatBucket:
        return FlatBucket(grad.clone(), params, sizes)

    def codec(s: int):
        """The hook's codec work at ``s`` chunks (encode, store residuals), sending nothing."""
        st, b = states[s], bucket()
        residual = st.memory.residual(0, st.memory.keys(b), b.gradients())
        encoded = list(encode_chunks(st.topk, b.buffer(), residual, sizes, st.plan(1, sizes), 1.0, s))
        store_residuals([(c.marker, res, acc) for c, res, acc in encoded])
        return b, [c for c, _, _ in encoded]

    def exchange(s: int, b: FlatBucket, chunks: list) -> torch.futures.Future:
        """The same chunks' collectives and decode, no codec work."""
        return finish_exchange(b.buffer(), [issue_chunk(states[s].exchange_group, c) for c in chunks])

    def codec_beside_exchange() -> float:
        """The one-chunk codec while another bucket's collectives are on the wire (not decoded):
        what the link's CPU work (gloo's threads, the kernel's TCP and tc) takes from its core."""
        _, chunks = codec(1)
        dist.barrier()
        futs = [f for c in chunks for f in issue_chunk(states[1].exchange_group, c).futs]
        t0 = time.perf_counter()
        codec(1)
        elapsed = time.perf_counter() - t0
        torch.futures.wait_all(futs)
        return elapsed

    out = {f"{what}_stages_{s}": [] for s in counts for what in ("codec_s", "comm_s")}
    out.update({f"hook_s_stages_{s}": [] for s in args.stages}, codec_beside_exchange_s=[])
    for r in range(args.rounds + 1):  # the first round warms up and is dropped
        out["codec_beside_exchange_s"].append(codec_beside_exchange())
        for s in counts[r % len(counts):] + counts[:r % len(counts)]:  # the order rotates per round
            b, chunks = codec(s)
            out[f"codec_s_stages_{s}"].append(_timed(lambda s=s: codec(s)))
            out[f"comm_s_stages_{s}"].append(_timed(lambda s=s, b=b, chunks=chunks: exchange(s, b, chunks).wait()))
            if s in args.stages:
                out[f"hook_s_stages_{s}"].append(
                    _timed(lambda s=s: _compress(states[s], bucket(), 1, "compressed").wait()))
    out = {k: v[1:] for k, v in out.items()}
    out["codec_s"], out["comm_s"] = out["codec_s_stages_1"], out["comm_s_stages_1"]
    out["setup"] = {"numel": sum(sizes), "params": args.params, "density": args.density,
                    "world": dist.get_world_size(), "bytes_per_rank": states[1].last_bytes_sent,
                    "auto_stages": auto_stages}
    return out

if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    exit_now(main())  # results written: no finalization to abort in (dist/exit_guard.py)
