"""How often a 2-rank gloo DDP job aborts at exit, with and without dist/exit_guard.py's wait.

Each round launches the same job (a small model, the weighted comm hook from ``build_comm_hook``,
``destroy_process_group()`` at the end) twice under torchrun, once as shipped and once with the exit
wait unregistered, and counts runs whose exit status is not 0 although every rank printed its
final line (torch 2.14's abort at interpreter exit, dist/exit_guard.py), and the ranks in which a
gloo work still held the last backward's context when the exit handlers began (the race the
guard's wait closes; it ends in an abort only when the work lets go during finalization).

    flock /tmp/hetero_cpu.lock .venv/bin/python benchmarks/bench_exit_abort.py --rounds 20 \\
        --json benchmarks/results/exit_abort.json
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
from pathlib import Path

from hetero_strategy.dist.ports import free_port

DONE = "trained, exiting"
HELD = "a work still holds the last backward's context at exit"


def worker(guard: bool) -> None:
    import atexit

    import torch
    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.dist import exit_guard
    from hetero_strategy.hooks import build_comm_hook

    dist.init_process_group("gloo")
    torch.manual_seed(0)
    model = DistributedDataParallel(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    state, hook = build_comm_hook(HeteroConfig.from_flat(), max_steps=15)
    model.register_comm_hook(state, hook)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for _ in range(15):
        state.set_local_batch(8, 16)
        x = torch.randn(8, 5)
        torch.nn.functional.mse_loss(model(x), x.sum(dim=1, keepdim=True)).backward()
        optimizer.step()
        optimizer.zero_grad()
    if not guard:
        atexit.unregister(exit_guard.wait_for_release)

    def held_at_exit() -> None:  # runs before the guard's wait (atexit is last in, first out)
        if exit_guard.still_held():
            print(HELD, flush=True)

    atexit.register(held_at_exit)
    print(DONE, flush=True)
    dist.destroy_process_group()


def launch(guard: bool, timeout: float = 120.0) -> dict:
    """One job; its exit status and whether both ranks finished training first."""
    torchrun = str(Path(sys.executable).parent / "torchrun")
    cmd = [torchrun, "--nproc-per-node", "2", "--master-addr", "127.0.0.1", "--master-port", str(free_port()),
           __file__, "--worker", "guard" if guard else "no-guard"]
    env = dict(os.environ, OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo")
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        log = "timed out"
    finally:
        try:
            os.killpg(proc.pid, signal.SIGKILL)  # ranks left behind would hold the CPU
        except ProcessLookupError:
            pass
        proc.wait()
    return {"rc": proc.returncode, "trained": log.count(DONE) == 2, "sigabrt": "SIGABRT" in log,
            "held": log.count(HELD)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--json", type=Path)
    parser.add_argument("--worker", choices=["guard", "no-guard"], help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args.worker == "guard")
        return
    runs: dict[str, list[dict]] = {"no_guard": [], "guard": []}
    for k in range(args.rounds):  # alternating, so both see the same machine
        for name in ("no_guard", "guard"):
            runs[name].append(launch(name == "guard"))
        print(f"round {k + 1}: " + ", ".join(f"{n} rc={r[-1]['rc']}" for n, r in runs.items()), flush=True)
    from hetero_strategy.commands.provenance import source_commit

    out = {"rounds": args.rounds, "torch": __import__("torch").__version__, "commit": source_commit(),
           "methods": {n: {"runs": len(r), "failed": sum(x["rc"] != 0 for x in r),
                           "aborted_after_training": sum(x["rc"] != 0 and x["trained"] and x["sigabrt"] for x in r),
                           "untrained": sum(not x["trained"] for x in r),
                           "ranks_held_at_exit": sum(x["held"] for x in r)} for n, r in runs.items()}}
    print(json.dumps(out, indent=1))
    if args.json:
        args.json.write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
