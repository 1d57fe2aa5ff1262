"""Start one process per rank, watch them, and stop all of them when one fails or time runs out."""

from __future__ import annotations

import os
import signal
import subprocess
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from hetero_strategy.emulate.throttle import DutyCycle

__all__ = ["RankProcess", "RunResult", "die_with_parent", "request_stop", "run_with_restarts", "supervise"]

_POLL_S = 0.05
_TERM_GRACE_S = 3.0
# Signals seen by a handler that called request_stop(): the watch loop re-raises them even when the
# handler's own exception was swallowed (see _spawn_all).
_STOP_SIGNALS: list[int] = []


def request_stop(signum: int) -> None:
    """Called from a signal handler: the running :func:`supervise` stops every rank and raises."""
    _STOP_SIGNALS.append(signum)


@dataclass
class RankProcess:
    """How to start one rank: argv, environment, and a pre-exec hook (cgroup + pinning)."""

    rank: int
    argv: list[str]
    env: dict[str, str]
    preexec: Callable[[], None] | None = None
    throttle: float = 1.0  # < 1: SIGSTOP/SIGCONT duty cycle (simulated compute)


@dataclass
class RunResult:
    """Outcome of :func:`supervise`: per-rank exit codes and (when captured) output."""

    returncodes: list[int]
    outputs: list[str] = field(default_factory=list)
    wall_s: float = 0.0
    timed_out: bool = False
    failed_rank: int | None = None
    restarts: int = 0  # attempts after the first (EmulatedCluster.run(max_restarts=...))

    @property
    def ok(self) -> bool:
        return not self.timed_out and all(c == 0 for c in self.returncodes)

    @property
    def returncode(self) -> int:
        """0 when every rank succeeded; 124 on timeout; else the first failing rank's code (or 1)."""
        if self.timed_out:
            return 124
        if self.failed_rank is not None:
            code = self.returncodes[self.failed_rank]
            return code if code > 0 else 128 + (-code)  # killed by a signal: shell convention
        return next((c for c in self.returncodes if c != 0), 0)


def run_with_restarts(attempt: Callable[[int, float], RunResult], timeout: float, max_restarts: int,
                      on_restart: Callable[[RunResult, int], None] | None = None) -> RunResult:
    """As ``torchrun --max-restarts``: ``attempt(k, seconds_left)`` runs the whole job for the k-th
    time (0 first); a failed job starts again, at most ``max_restarts`` times, while ``timeout``
    (covering all attempts) lasts. ``on_restart(result, k)`` is told of each restart."""
    deadline = time.monotonic() + timeout
    k = 0
    while True:  # at most max_restarts + 1 attempts
        result = attempt(k, max(1.0, deadline - time.monotonic()))
        result.restarts = k
        if result.ok or result.timed_out or k == max_restarts:
            return result
        k += 1
        if on_restart is not None:
            on_restart(result, k)


def supervise(ranks: Sequence[RankProcess], timeout: float, capture: bool = True) -> RunResult:
    """Run every rank; the first non-zero exit or the timeout stops all of them (bounded waits)."""
    # Files, not pipes: a chatty rank can never block on a full pipe while we poll.
    logs = [tempfile.TemporaryFile(mode="w+b") for _ in ranks] if capture else []  # noqa: SIM115 - closed below
    procs: list[subprocess.Popen] = []
    throttles: list[DutyCycle] = []
    t0 = time.monotonic()
    result = RunResult(returncodes=[])
    try:
        _spawn_all(ranks, logs, procs)
        for r, p in zip(ranks, procs):
            throttles.append(DutyCycle(p.pid, r.throttle))
            throttles[-1].start()
        _watch(procs, t0 + timeout, result)
    finally:
        for t in throttles:
            t.stop()
        stop_all(procs)
        result.returncodes = [p.returncode if p.returncode is not None else -9 for p in procs]
        result.wall_s = time.monotonic() - t0
        for f in logs:
            f.seek(0)
            result.outputs.append(f.read().decode(errors="replace"))
            f.close()
    return result


def _spawn_all(ranks: Sequence[RankProcess], logs: list, procs: list[subprocess.Popen]) -> None:
    """Start every rank with SIGINT/SIGTERM held back in this (main) thread.

    NOTE: a KeyboardInterrupt raised while fork() runs its at-fork hooks (logging registers one)
    is printed and dropped by CPython ("Exception ignored in _releaseLock"): Ctrl-C would be lost
    and the launcher would wait on. Held signals are delivered right after the last fork.
    """
    held = {signal.SIGINT, signal.SIGTERM, signal.SIGHUP}
    previous = signal.pthread_sigmask(signal.SIG_BLOCK, held)
    try:
        for i, r in enumerate(ranks):
            out = logs[i] if logs else None
            procs.append(subprocess.Popen(r.argv, env=r.env, stdout=out, stderr=subprocess.STDOUT if logs else None,
                                          # NOTE: the child only unblocks signals, sets PR_SET_PDEATHSIG, writes a cgroup file and
                                          # sets its affinity (no locks taken).
                                          start_new_session=True, preexec_fn=_child_setup(r.preexec, held)))  # noqa: PLW1509
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, previous)


def _child_setup(preexec: Callable[[], None] | None, held: set) -> Callable[[], None]:
    def setup() -> None:  # runs in the child between fork and exec; the mask would survive exec
        signal.pthread_sigmask(signal.SIG_UNBLOCK, held)
        die_with_parent()
        if preexec is not None:
            preexec()
    return setup


def _resolve_prctl():
    import ctypes

    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):  # not Linux: the stale clean-up of the next emulate still applies
        return None


_PRCTL = _resolve_prctl()  # NOTE: looked up here, in the parent: no dlopen between fork and exec


def die_with_parent() -> None:
    """PR_SET_PDEATHSIG: the kernel SIGKILLs this process when its launcher dies, even by SIGKILL.

    For a preexec_fn. It survives the exec of ``nsenter`` (or ``ip netns exec``) and of the rank (neither is
    set-uid); it covers the launcher's direct children only, not their own children.
    """
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGKILL)  # 1 = PR_SET_PDEATHSIG


def _watch(procs: list[subprocess.Popen], deadline: float, result: RunResult) -> None:
    max_polls = int((deadline - time.monotonic()) / _POLL_S) + 2
    for _ in range(max_polls):  # bounded in count as well as in time
        if _STOP_SIGNALS:
            signum = _STOP_SIGNALS.pop()
            if signum == signal.SIGINT:
                raise KeyboardInterrupt
            raise SystemExit(128 + signum)
        codes = [p.poll() for p in procs]
        failed = [i for i, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            result.failed_rank = failed[0]
            return
        if all(c is not None for c in codes):
            return
        if time.monotonic() >= deadline:
            break
        time.sleep(_POLL_S)
    result.timed_out = True


def stop_all(procs: list[subprocess.Popen]) -> None:
    """SIGTERM each rank's process group, then SIGKILL what is left after a short grace."""
    live = [p for p in procs if p.poll() is None]
    for p in live:
        _killpg(p.pid, signal.SIGCONT)
        _killpg(p.pid, signal.SIGTERM)
    deadline = time.monotonic() + _TERM_GRACE_S
    for p in live:
        try:
            p.wait(timeout=max(0.0, deadline - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    for p in procs:
        _killpg(p.pid, signal.SIGKILL)  # also reaps children that outlived their leader
        try:
            p.wait(timeout=5)
        except subprocess.TimeoutExpired:
            pass


def _killpg(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass
