"""Run a function on N gloo ranks on loopback: free port, timeout, cleanup.

The environment mirrors torchrun (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, GROUP_RANK,
MASTER_ADDR/PORT), so Lightning sees a torchrun launch and starts no processes of its own.
"""

from __future__ import annotations

import os
import queue
import traceback
from collections.abc import Callable
from typing import Any

import torch.multiprocessing as mp

from hetero_strategy.dist.ports import free_port

__all__ = ["free_port", "init_gloo", "launch_env", "run_command", "run_distributed"]


# What a launcher (torchrun, Lightning, an earlier test) may have left in this process's environment:
# passed on, it makes a script believe it is one rank of a job already running, and it waits forever.
_LAUNCH_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK", "ROLE_RANK",
                "MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_RUN_ID", "HETERO_STRATEGY_CONFIG", "CUDA_VISIBLE_DEVICES")


def launch_env(**extra: str) -> dict[str, str]:
    """A clean environment for launching a 2-rank job on loopback: fresh port, this venv first on PATH."""
    import sys

    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS and not k.startswith(("PL_", "ACCELERATE_"))}
    bin_dir = os.path.dirname(sys.executable)
    env.update(OMP_NUM_THREADS="1", GLOO_SOCKET_IFNAME="lo", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()),
               PATH=f"{bin_dir}{os.pathsep}{env.get('PATH', '')}")
    env.update(extra)
    return env


def run_command(cmd: list[str], *, env: dict[str, str], timeout: float, cwd: Any = None) -> tuple[int, str]:
    """(exit code, output) of a launcher command; its whole process group (ranks included) is killed
    after it, whether it ended, failed or timed out: a rank left behind would hold the port and the CPU.

    NOTE: a session of its own, so the ranks a launcher starts die with it.
    """
    import contextlib
    import signal
    import subprocess

    proc = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        log, _ = proc.communicate()
        raise AssertionError(f"{' '.join(cmd[:3])} ... timed out after {timeout} s:\n{log[-4000:]}") from None
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)  # NOTE: the group outlives its leader while a rank lives
        proc.wait()
    return proc.returncode, log


def elastic_torchrun(script: Any, out: Any, *args: str, ranks: int = 2, restarts: int = 0) -> str:
    """``script out args`` under torchrun as docs/reliability.md launches a job that restarts: c10d
    rendezvous on a free port, a store per attempt; asserts success, returns the log."""
    import sys
    from pathlib import Path

    Path(out).mkdir(parents=True, exist_ok=True)
    env = launch_env(TORCH_DISABLE_SHARE_RDZV_TCP_STORE="1")
    cmd = [str(Path(sys.executable).parent / "torchrun"), "--nproc-per-node", str(ranks), "--max-restarts",
           str(restarts), "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{free_port()}", str(script),
           str(out), *args]
    rc, log = run_command(cmd, env=env, timeout=240)
    assert rc == 0, log[-5000:]
    return log


def init_gloo(rank: int, world_size: int) -> None:
    """Initialise the default gloo group from the environment run_distributed set."""
    import datetime

    import torch.distributed as dist

    dist.init_process_group("gloo", rank=rank, world_size=world_size, timeout=datetime.timedelta(seconds=60))


def _to_bytes(value: Any) -> bytes:
    import io

    import torch

    buf = io.BytesIO()
    torch.save(value, buf)
    return buf.getvalue()


def _from_bytes(data: bytes) -> Any:
    import io

    import torch

    return torch.load(io.BytesIO(data), weights_only=False)


def _child(fn: Callable, rank: int, world_size: int, port: int, args: tuple, results: Any) -> None:
    os.environ.update(
        MASTER_ADDR="127.0.0.1",
        MASTER_PORT=str(port),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        GROUP_RANK="0",
        NODE_RANK="0",
        WORLD_SIZE=str(world_size),
        LOCAL_WORLD_SIZE=str(world_size),
        GLOO_SOCKET_IFNAME="lo",
        OMP_NUM_THREADS="1",
    )
    import torch

    torch.set_num_threads(1)
    try:
        out = fn(rank, world_size, *args)
        # Serialise here: a tensor put on the queue as-is is shared by file descriptor, and
        # the parent cannot fetch that descriptor once this process has exited (a race that
        # fails as FileNotFoundError on a loaded machine).
        results.put((rank, True, _to_bytes(out)))
    except BaseException:  # noqa: BLE001 - the parent re-raises with the child's traceback
        results.put((rank, False, traceback.format_exc()))
    finally:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            dist.destroy_process_group()


def _context() -> Any:
    """A forkserver that imported torch and Lightning once: each rank forks from it in a fraction
    of a second instead of importing them afresh (Lightning's import alone takes ~10 s here).

    NOTE: the server imports and never runs torch ops, so no thread pool exists to break a fork;
    a test that needs a process without Lightning runs its own interpreter (subprocess).
    """
    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["torch", "torch.distributed", "lightning.pytorch", "accelerate", "hetero_strategy"])
    return ctx


def run_distributed(fn: Callable, world_size: int, *args: Any, timeout: float = 120.0,
                    may_die: tuple[int, ...] = ()) -> list[Any]:
    """fn(rank, world_size, *args) on ``world_size`` processes; returns the per-rank results.

    Raises RuntimeError with the failing rank's traceback, or TimeoutError after ``timeout`` s;
    every child is terminated in all cases. Ranks in ``may_die`` (a test kills them) may end
    without a result: theirs is None, and the others' results are awaited.
    """
    ctx = _context()
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_child, args=(fn, r, world_size, port, args, results), daemon=True)
             for r in range(world_size)]
    for p in procs:
        p.start()
    out: dict[int, Any] = {}
    try:
        import time

        deadline = time.monotonic() + timeout
        while len(out) < world_size:
            for r in may_die:  # a killed rank's result never comes
                if r not in out and procs[r].exitcode not in (None, 0):
                    out[r] = None
            if len(out) == world_size:
                break
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError(f"run_distributed: {world_size - len(out)} rank(s) did not finish "
                                   f"within {timeout:.0f} s")
            try:
                rank, ok, value = results.get(timeout=min(left, 1.0))
            except queue.Empty:
                dead = [r for r, p in enumerate(procs) if p.exitcode not in (None, 0) and r not in out
                        and r not in may_die]
                if dead:
                    raise RuntimeError(f"rank {dead[0]} died with exit code {procs[dead[0]].exitcode}")
                continue
            if not ok:
                raise RuntimeError(f"rank {rank} failed:\n{value}")
            out[rank] = _from_bytes(value)
        return [out[r] for r in range(world_size)]
    finally:
        for p in procs:
            p.join(timeout=5)
            if p.is_alive():
                p.kill()
                p.join(timeout=5)
