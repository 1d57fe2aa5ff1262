"""``hetero-strategy bench overlap``: does the pipelined Top-K hook overlap its codec with its exchange?

Two ranks on the emulated cluster (``--link``, default 100 Mbit/s, where a 16M-entry bucket at 2%
takes about as long on the wire as in the codec on one CPU core), or on loopback with ``--local``.
Per round, for each stage count in turn (:mod:`.overlap_worker`): the codec alone (T_codec), the
exchange alone (T_comm), both at that stage count's chunking, and the whole hook (T_hook). Overlap
efficiency = (T_codec + T_comm - T_hook) / min(T_codec, T_comm): 0 for a serial hook, 1 when the
shorter of the two is hidden completely. ``efficiency`` takes T_codec and T_comm of one chunk (the
hook without pipelining); ``efficiency_same_chunks`` those at the hook's own chunking, which leaves
out what smaller chunks gain on their own (a faster codec from cache, a shorter exchange through
the shaped link). Medians over rounds, with [min, max].

Example::

    flock /tmp/hetero_cpu.lock hetero-strategy bench overlap --json benchmarks/results/overlap.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
from pathlib import Path

from hetero_bench import RESULTS
from hetero_bench._ranks import worker
from hetero_strategy.commands.flags import MTU, count, number, output_file, rate

__all__ = ["add_arguments", "run", "summarise"]

_WORKER = "overlap_worker"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--json", type=output_file, default=str(RESULTS / "overlap.json"), help="where to write results")
    parser.add_argument("--link", type=rate, default="100mbit", help="emulated link rate of both ranks")
    parser.add_argument("--mtu", type=MTU, default=None,
                        help="the emulated links' MTU (default 9000): at Linux's 1500 the kernel's per-packet "
                             "work, which a real NIC does, takes CPU from the codec beside a transfer")
    parser.add_argument("--rounds", type=count(1), default=7, help="alternating rounds (the first is dropped)")
    parser.add_argument("--numel", type=count(1024), default=1 << 24, help="entries in the synthetic bucket")
    parser.add_argument("--density", type=number(0.0, 1.0, what="a density"), default=0.02, help="Top-K density")
    parser.add_argument("--stages", type=count(1), nargs="+", default=[1, 2, 4, 8], help="stage counts to time")
    parser.add_argument("--local", action="store_true", help="loopback instead of the emulated cluster (no root)")


def summarise(raw: dict) -> dict:
    """Medians, spreads and the overlap efficiency of every stage count, round by round.

    ``efficiency`` compares the hook with the codec and exchange of the unpipelined hook (one
    chunk), as the issue defines it: smaller chunks' faster codec and exchange count as overlap.
    ``efficiency_same_chunks`` compares it with the codec and exchange at its own chunking, so
    only the overlap itself counts.
    """
    med = {k: statistics.median(v) for k, v in raw.items() if k != "setup"}

    def eff(codec: list, comm: list, hook: list) -> list:
        return [(c + m - h) / min(c, m) for c, m, h in zip(codec, comm, hook)]

    out = {"codec_s": med["codec_s"], "comm_s": med["comm_s"], "stages": {}}
    if "codec_beside_exchange_s" in med:  # the one-chunk codec with another exchange on the wire
        out["codec_beside_exchange_s"] = med["codec_beside_exchange_s"]
    for key in (k for k in raw if k.startswith("hook_s_stages_")):
        s = int(key.rsplit("_", 1)[1])
        one = eff(raw["codec_s"], raw["comm_s"], raw[key])
        own = eff(raw[f"codec_s_stages_{s}"], raw[f"comm_s_stages_{s}"], raw[key])
        out["stages"][s] = {"hook_s": med[key], "hook_spread_s": [min(raw[key]), max(raw[key])],
                            "codec_s": med[f"codec_s_stages_{s}"], "comm_s": med[f"comm_s_stages_{s}"],
                            "efficiency": statistics.median(one), "efficiency_spread": [min(one), max(one)],
                            "efficiency_same_chunks": statistics.median(own),
                            "efficiency_same_chunks_spread": [min(own), max(own)],
                            "speedup_vs_one_stage": med["hook_s_stages_1"] / med[key]
                            if "hook_s_stages_1" in med else None}
    return out


def run(args: argparse.Namespace) -> int:
    if args.local and args.mtu is not None:
        print(f"--mtu={args.mtu} is invalid with --local: loopback has no emulated links; drop one of them")
        return 2
    mtu = None if args.local else args.mtu or 9000
    out = Path(args.json)
    out.parent.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "overlap.json")
        cmd = worker(_WORKER)
        argv = [*cmd, "--out", path, "--rounds", str(args.rounds), "--numel", str(args.numel),
                "--density", str(args.density), "--stages", *map(str, args.stages)]
        if args.local:
            from hetero_bench.compression import _local

            _local(argv[len(cmd):], timeout=900, argv=cmd)
        else:
            from hetero_strategy.emulate import EmulatedCluster

            with EmulatedCluster(compute=[1.0, 1.0], links=[args.link, args.link], mtu=mtu) as cluster:
                result = cluster.run(argv, timeout=900)
            if not result.ok:
                raise RuntimeError(f"overlap bench failed (rc {result.returncode}):\n" + "\n".join(result.outputs)[-3000:])
        raw = json.loads(Path(path).read_text())
    summary = summarise(raw)
    link = "loopback" if args.local else f"emulated {args.link}"
    result = {**summary, "raw": raw, "setup": {**raw["setup"], "link": link, "mtu": mtu,
                                               "rounds": args.rounds,
                                               "statistics": "medians over rounds; spreads [min, max]"}}
    out.write_text(json.dumps(result, indent=2))
    print(f"codec {summary['codec_s']:.3f} s ({summary['codec_beside_exchange_s']:.3f} s beside an exchange), "
          f"exchange {summary['comm_s']:.3f} s in one chunk ({link}{'' if mtu is None else f', MTU {mtu}'}); "
          f"pipeline_stages='auto' picks {raw['setup']['auto_stages']}")
    for s, v in summary["stages"].items():
        print(f"  {s} stage(s): codec {v['codec_s']:.3f} s, exchange {v['comm_s']:.3f} s, hook {v['hook_s']:.3f} s, "
              f"overlap efficiency {v['efficiency']:.2f} [{v['efficiency_spread'][0]:.2f}, "
              f"{v['efficiency_spread'][1]:.2f}], at the same chunking {v['efficiency_same_chunks']:.2f}")
    return 0
