"""``bench balance``'s interleaved measure of fixed splits (``balance_worker --mode cycle``).

Every arm, plain DDP at equal batches or the hetero runtime at one fixed split (the ``split``
mode's training), is built in one launch and stepped in blocks of ``--block-steps``, arms taking
turns, the order reversed every other block. On this project's 2-core VM one core's speed moves
by 2-15% between half-second windows, mostly independently of the other core (their ratio by
5-20%; benchmarks/bench_host_noise.py, docs/benchmarks.md), so
splits measured in separate launches a minute apart compare two machines; here every arm has a
turn in each rotation (about 12 s for ten arms), and a drift over seconds falls on all of them.
A block's figure is the mean of its steps but the first (which brings the arm's model back into
cache and waits out the previous arm's last step).

Example::

    PYTHONPATH=benchmarks torchrun --nproc-per-node 2 -m hetero_bench.balance_worker --framework ddp \\
        --mode cycle --arms "ddp;91,37;100,28" --blocks 4 --out /tmp/cycle
"""

from __future__ import annotations

import argparse
import statistics
import time

from hetero_bench.balance_fit_ddp import build
from hetero_bench.balance_workload import parse_sizes, stepper

__all__ = ["WARMUP_STEPS", "cycle", "parse_arms"]

WARMUP_STEPS = 2
"""Untimed steps per arm first: DDP rebuilds its buckets after the first, and the allocator grows."""


def parse_arms(text: str) -> list[list[int] | None]:
    """``"ddp;91,37;100,28"`` -> [None, [91, 37], [100, 28]] (None: plain DDP at equal batches).

    Raises:
        ValueError: naming ``--arms``, the value and the form.
    """
    arms: list[list[int] | None] = []
    for part in (p.strip() for p in text.split(";")):
        sizes = None if part == "ddp" else parse_sizes(part)
        if sizes is None and part != "ddp":
            raise ValueError(f"--arms={text!r} is invalid: give arms separated by ';', each 'ddp' or per-rank "
                             "batch sizes >= 1, e.g. 'ddp;91,37;100,28'")
        arms.append(sizes)
    return arms


def cycle(args: argparse.Namespace, world: int) -> dict:
    """Each arm's step time per block (rank 0's wall clock; DDP's exchange keeps the ranks in step)
    and this rank's batch in its last step."""
    arms = parse_arms(args.arms)
    steps = WARMUP_STEPS + args.blocks * args.block_steps
    runs, clocks = [], []
    for sizes in arms:
        arm = argparse.Namespace(**{**vars(args), "sizes": None if sizes is None else ",".join(map(str, sizes)),
                                    "count_bytes": False, "plan_sizes": None})
        _, model, loader, loss_of, opt, clock, runtime = build("ddp" if sizes is None else "split", arm, world, steps)
        runs.append(stepper(model, loader, loss_of, opt, clock, runtime))
        clocks.append(clock)
    taken = [0] * len(arms)

    def step(k: int) -> float:
        t0 = time.perf_counter()
        runs[k](taken[k])
        taken[k] += 1
        return time.perf_counter() - t0

    for k in range(len(arms)):
        for _ in range(WARMUP_STEPS):
            step(k)
    times: list[list[float]] = [[] for _ in arms]
    for block in range(args.blocks):
        for k in range(len(arms)) if block % 2 == 0 else reversed(range(len(arms))):
            got = [step(k) for _ in range(args.block_steps)]
            times[k].append(statistics.fmean(got[1:] or got))
    return {"mode": "cycle", "arms": [{"sizes": sizes, "step_s": t, "batch": clock.batches[-1]}
                                      for sizes, t, clock in zip(arms, times, clocks)]}
