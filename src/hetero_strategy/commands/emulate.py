"""``hetero-strategy emulate``: run N ranks of any command on an emulated heterogeneous cluster.

Example::

    hetero-strategy emulate --nproc 2 --compute 1.0,0.57 --link 10gbit,100mbit -- python train.py
    hetero-strategy emulate --simulate --compute 1.0,0.57 -- python train.py   # without root
    hetero-strategy emulate --compute 1.0,0.57 --memory 4G,1.5G -- python train.py   # a small slow card
    # node A: 1 rank on 10 Gbit; node B: 3 ranks sharing a namespace (loopback inside) and a 1 Gbit link
    hetero-strategy emulate --nodes 1,3 --compute 1.0,0.4,0.4,0.4 --link 10gbit,1gbit -- python train.py
"""

from __future__ import annotations

import argparse
import json

from hetero_strategy.commands.flags import (
    MTU,
    UsageError,
    cluster_spec,
    count,
    number,
    output_file,
    rates,
    shares,
)

NAME = "emulate"
HELP = "Run N ranks of a command on an emulated heterogeneous cluster (namespaces + tbf + cgroups)."

__all__ = ["HELP", "NAME", "add_arguments", "run"]


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--nproc", type=count(1, 1024), default=None,
                        help="number of ranks, 1 to 1024 (default: entries in --compute)")
    parser.add_argument("--compute", type=shares, default=None, help="per-rank share of one core, e.g. 1.0,0.57 (default 1.0)")
    parser.add_argument("--nodes", default=None,
                        help="ranks per node, e.g. 1,3: a node's ranks share a namespace and a link, and get "
                             "torchrun's per-node LOCAL_RANK / LOCAL_WORLD_SIZE / GROUP_RANK")
    parser.add_argument("--link", type=rates, default=None,
                        help="per-rank (per-node with --nodes) link rate, e.g. 10gbit,100mbit ('none' = unshaped)")
    parser.add_argument("--latency", default=None,
                        help="per-rank (per-node with --nodes) tbf queueing-latency bound in ms (default 50)")
    parser.add_argument("--mtu", type=MTU, default=1500,
                        help="every link's MTU in bytes, up to 9000 (jumbo frames: less kernel work per byte "
                             "charged to the ranks' CPU quota)")
    parser.add_argument("--memory", default=None,
                        help="per-rank memory limit, e.g. 1.5G,4G (none: no limit); the kernel kills a rank over it")
    parser.add_argument("--simulate", action="store_true",
                        help="no root: loopback, unshaped links, compute slowed by a SIGSTOP/SIGCONT duty cycle")
    parser.add_argument("--timeout", type=number(what="seconds"), default=3600.0, help="stop every rank after this many seconds")
    parser.add_argument("--max-restarts", type=count(0), default=0,
                        help="restart every rank this many times at most when one fails, as torchrun does")
    parser.add_argument("--no-measure", action="store_true", help="skip the per-rank link bandwidth probe")
    parser.add_argument("--json", type=output_file, default=None, help="write the cluster description and exit codes here")
    parser.add_argument("cmd", nargs=argparse.REMAINDER, help="-- command to run on every rank")


def run(args: argparse.Namespace) -> int:
    from rich.console import Console

    from hetero_strategy.config.files import write_atomic
    from hetero_strategy.emulate import EmulatedCluster, EmulatorError
    from hetero_strategy.emulate.report import cluster_table
    from hetero_strategy.emulate.spec import parse_float_list, parse_link_list

    console = Console(stderr=True)
    cmd = args.cmd[1:] if args.cmd[:1] == ["--"] else args.cmd
    if not cmd:
        console.print("[red]emulate: give the command to run after --, e.g. `-- python train.py`")
        return 2
    try:
        compute, links, latency, nodes = _resolve(args, parse_float_list, parse_link_list)
        memory = parse_link_list(args.memory)  # comma-separated, as the links
        flags = {"--compute": args.compute, "--link": args.link, "--latency": args.latency, "--nodes": args.nodes,
                 "--mtu": args.mtu if args.mtu != 1500 else None, "--simulate": True if args.simulate else None,
                 "--memory": args.memory}
        cluster_spec(flags, compute=compute, links=links, latency_ms=latency, nodes=nodes, simulate=args.simulate,
                     mtu=args.mtu, memory=memory)  # the emulator's own check, refused naming the flags
        cluster = EmulatedCluster(compute, links, latency, simulate=args.simulate, measure=not args.no_measure,
                                  nodes=nodes, mtu=args.mtu, memory=memory)
    except (UsageError, ValueError) as e:
        console.print(f"emulate: {e}", style="red", markup=False, highlight=False, soft_wrap=True)  # one line
        return 2
    # NOTE: SIGTERM, SIGHUP and Ctrl-C unwind through the `with` below (commands/signals.py)
    try:
        with cluster:
            for name in cluster.stale_removed:
                console.print(f"emulate: removed stale {name}")
            console.print(cluster_table(cluster.describe()))
            def restarting(failed, attempt: int) -> None:
                console.print(f"[yellow]emulate: rank {failed.failed_rank} exited with "
                              f"{failed.returncodes[failed.failed_rank]}; restarting every rank "
                              f"(restart {attempt} of {args.max_restarts})")

            result = cluster.run(cmd, timeout=args.timeout, capture=False, max_restarts=args.max_restarts,
                                 on_restart=restarting)
        label = " (simulated)" if args.simulate else ""
        if result.timed_out:
            console.print(f"[red]emulate{label}: timed out after {args.timeout:.0f} s; all ranks stopped")
        elif result.failed_rank is not None:
            console.print(f"[red]emulate{label}: rank {result.failed_rank} exited with "
                          f"{result.returncodes[result.failed_rank]}; the other ranks were stopped")
        else:
            again = f" after {result.restarts} restart(s)" if result.restarts else ""
            console.print(f"emulate{label}: all {len(compute)} ranks finished{again} in {result.wall_s:.1f} s")
        if args.json:
            write_atomic(args.json, json.dumps({"cluster": cluster.describe(), "returncodes": result.returncodes,
                                                "timed_out": result.timed_out, "wall_s": result.wall_s}, indent=2))
        return result.returncode
    except EmulatorError as e:
        console.print(f"[red]emulate: {e}")
        return 1
    except KeyboardInterrupt:
        console.print("[yellow]emulate: interrupted; every rank stopped and the cluster removed")
        return 130


def _resolve(args, parse_float_list, parse_link_list):
    compute = parse_float_list(args.compute, "--compute") if args.compute else None
    nodes = None
    if args.nodes:
        try:
            nodes = [int(x) for x in args.nodes.split(",") if x.strip()]
        except ValueError:
            nodes = []
        if not nodes or min(nodes) < 1:
            raise ValueError(f"--nodes={args.nodes!r} is invalid: give each node's rank count (>= 1), e.g. 1,3")
    n = args.nproc or (sum(nodes) if nodes else len(compute) if compute else 1)
    if nodes is not None and sum(nodes) > 1024:  # NOTE: as --nproc's bound; [1.0] * 2**63 overflowed
        raise ValueError(f"--nodes={args.nodes!r} is invalid: give at most 1024 ranks in all")
    if nodes is not None and sum(nodes) != n:
        raise ValueError(f"--nodes={args.nodes!r} is invalid: its {sum(nodes)} ranks do not match --nproc={n}")
    if args.nproc is not None and args.nproc < 1:
        raise ValueError(f"--nproc={args.nproc} is invalid: give at least 1 rank")
    if compute is None:
        compute = [1.0] * n
    if len(compute) == 1:
        compute = compute * n
    if len(compute) != n:
        where = f"--nodes={args.nodes}" if nodes and not args.nproc else f"--nproc={n}"
        raise ValueError(f"--compute={args.compute!r} is invalid: give 1 factor or {n} (one per rank of {where})")
    latency = parse_float_list(args.latency, "--latency") if args.latency else None
    return compute, parse_link_list(args.link), latency, nodes
