"""Run ``hetero-strategy profile`` on this machine's ranks so the wizard can propose from a fresh measurement.

The profiler needs one process per rank joined by torch.distributed, which the wizard's own process
cannot provide; it is started as ``torchrun``-style subprocesses on loopback and its JSON read back.
Only this machine's ranks can be measured this way: for several machines run
``hetero-strategy profile`` under the real launcher and give the wizard its JSON.

Example::

    path = run_profiler(Path("."), nproc=2, cpu=True)   # writes ./cluster-profile.json
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

from hetero_strategy.wizard.question import WizardError

__all__ = ["CPU_PROFILE_ARGS", "PROFILE_NAME", "profiler_command", "run_profiler"]

PROFILE_NAME = "cluster-profile.json"
CPU_PROFILE_ARGS: list[str] = ["--max-bytes", "4MB"]
"""Profiler options on CPU: the all-reduce sweep up to 256 MB takes minutes over gloo."""


def profiler_command(out: Path, nproc: int, cpu: bool) -> list[str]:
    cmd = [sys.executable]
    if nproc > 1:
        from hetero_strategy.dist.ports import free_port  # NOTE: here: the wizard starts without torch
        cmd += ["-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                "--master-addr", "127.0.0.1", "--master-port", str(free_port())]
    cmd += ["-m", "hetero_strategy.cli", "profile", "--json", str(out)]
    if cpu:
        cmd += CPU_PROFILE_ARGS
    return cmd


def run_profiler(output_dir: Path, nproc: int, *, cpu: bool, timeout_s: float = 600.0) -> str:
    """Profile ``nproc`` local ranks; return the path of the JSON written into ``output_dir``."""
    output_dir.mkdir(parents=True, exist_ok=True)
    out = output_dir / PROFILE_NAME
    env = dict(os.environ)
    if cpu:
        env["CUDA_VISIBLE_DEVICES"] = ""  # the answers said CPU: do not measure the GPUs of this box
    env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # the ranks are local: keep gloo on loopback
    print(f"profile: measuring {nproc} rank(s) of this machine (a minute or so) ...", file=sys.stderr, flush=True)
    # NOTE: a session of its own so that a timeout or Ctrl-C stops every rank, not only the launcher.
    proc = subprocess.Popen(profiler_command(out, nproc, cpu), env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        output, _ = proc.communicate(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _kill(proc)
        raise WizardError(f"profile: the profiler did not finish within {timeout_s:.0f} s and was stopped; "
                          "read a profile JSON instead") from None
    except BaseException:  # Ctrl-C: leave no rank behind
        _kill(proc)
        raise
    if proc.returncode != 0 or not out.is_file():
        tail = "\n".join(output.splitlines()[-15:])
        raise WizardError(f"profile: the profiler exited with {proc.returncode}; choose another profile "
                          f"source or run `hetero-strategy profile --json PATH` yourself. Its output:\n{tail}")
    return str(out)


def _kill(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    proc.wait()
