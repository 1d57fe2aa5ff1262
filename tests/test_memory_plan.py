"""Memory-aware plans: the probe's memory fit, the caps it gives, and the emulator's memory limits."""

from __future__ import annotations

import os
import statistics
import subprocess
import sys

import pytest
import torch
from torch import nn

from hetero_strategy.balance.memory import MemoryCost, PeakMemory, fit_memory
from hetero_strategy.config import BalanceConfig, ConfigError
from hetero_strategy.runtime.planner import memory_caps

MB = 2**20


def test_a_cap_is_the_largest_pass_within_the_limit_less_the_margin():
    # hand numbers: 1000 MB limit, 10% kept free -> 900 MB; 300 MB fixed -> 600 MB for samples at 7 MB
    cost = fit_memory([(8, 300 * MB + 8 * 7 * MB), (16, 300 * MB + 16 * 7 * MB)], 1000 * MB)
    assert cost.fixed_bytes == pytest.approx(300 * MB) and cost.per_sample_bytes == pytest.approx(7 * MB)
    assert cost.cap(0.1) == 85  # 600 / 7 = 85.7
    assert MemoryCost(300 * MB, 7 * MB, None).cap(0.1) is None  # no limit known: no cap
    assert MemoryCost(300 * MB, 0.0, 1000 * MB).cap(0.1) is None  # no growth measured: no cap


def test_caps_per_rank_take_the_global_batch_where_a_limit_is_unknown():
    from hetero_strategy.balance.probe import StepCost

    limited = StepCost(10.0, 0.0, MemoryCost(300 * MB, 7 * MB, 1000 * MB))
    free = StepCost(10.0, 0.0, MemoryCost(300 * MB, 7 * MB, None))
    assert memory_caps([free, limited], BalanceConfig(), 128) == [128, 85]
    assert memory_caps([free, free], BalanceConfig(), 128) is None
    full = StepCost(10.0, 0.0, MemoryCost(897 * MB, 7 * MB, 1000 * MB))  # 900 MB less 897 leaves 3 MB
    with pytest.raises(ConfigError, match=r"rank 1: not one sample fits .*897.0 MB .*7.0 MB per sample .*1000 MB "
                                          r"less memory_margin=0.1\. Shard the model"):
        memory_caps([free, full], BalanceConfig(), 128)
    with pytest.raises(ConfigError, match=r"memory_margin=1.0 is invalid"):
        BalanceConfig(memory_margin=1.0)


@pytest.mark.parametrize("limit, calls", [
    (None, [[128, 64]]),  # no limit known: the probe goes straight to B and B/2
    (1000 * MB, [[32, 16], [85, 64]]),  # first B/4 and B/8; then the largest pass that fits (85), and B/2
])
def test_under_a_memory_limit_the_probes_own_steps_fit_it(monkeypatch, limit, calls):
    from torch.utils.data import DataLoader, TensorDataset

    from hetero_strategy.balance.memory import MEMORY_LIMIT_ENV
    from hetero_strategy.balance.probe import StepCost
    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.runtime.planner import _probe

    monkeypatch.delenv(MEMORY_LIMIT_ENV, raising=False)
    if limit is not None:
        monkeypatch.setenv(MEMORY_LIMIT_ENV, str(limit))
    seen = []

    def measure(batches, exchange):  # hand numbers: 300 MB fixed, 7 MB a sample, as a rank would measure
        seen.append([n for _, n in batches])
        assert all(len(b[0]) == n for b, n in batches)
        return StepCost(10.0, 0.0, MemoryCost(300 * MB, 7 * MB, limit))

    loader = DataLoader(TensorDataset(torch.zeros(500, 2)), batch_size=128)
    _probe(HeteroConfig(), loader, 128, measure)
    assert seen == calls


def test_peak_memory_sees_a_step_that_allocates_and_frees():
    with PeakMemory(torch.device("cpu")) as peak:
        start = peak.bytes
        x = torch.ones(64 * MB // 4)  # 64 MB, alive for ~50 ms, then freed
        x.add_(1)
        import time

        time.sleep(0.05)
        del x
    assert peak.bytes - start >= 60 * MB


class _Convs(nn.Module):
    """Activations dominate: 3 convolutions of 16 channels at 48 x 48 (about 1.6 MB per sample saved)."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.body = nn.Sequential(nn.Conv2d(3, 16, 3, padding=1), nn.ReLU(), nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(),
                                  nn.Conv2d(16, 16, 3, padding=1), nn.ReLU(), nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                                  nn.Linear(16, 1))

    def forward(self, x):
        return self.body(x)


_ORACLE = """
import ctypes, sys, torch
from pathlib import Path
sys.path.insert(0, {tests!r})
from test_memory_plan import _Convs
torch.set_num_threads(1)
ctypes.CDLL("libc.so.6").mallopt(-3, 64 << 10)  # the allocation mode a rank keeps under a memory limit
model, n = _Convs(), int(sys.argv[1])
for size in (96, n):  # a warm process first, as training is after the probe: then the kernel's peak of step n
    x = torch.randn(size, 3, 48, 48)
    for _ in range(2):
        model(x).pow(2).mean().backward()
    del x
    if size == 96:
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        Path(sys.argv[2]).write_text("0")  # the cgroup's peak starts again from now
"""


def _kernel_peak(n: int) -> int:
    """The kernel's own peak (its memory cgroup's) of a warm process's step at batch n, allocating as a
    rank under a memory limit does (balance/memory.py's exact_host_memory)."""
    from hetero_strategy.emulate.system import MemoryCgroup

    cgroup = MemoryCgroup(f"hsem-{os.getpid()}-0-memtest-{n}")
    try:
        reset = cgroup.path / ("memory.max_usage_in_bytes" if cgroup.version == 1 else "memory.peak")
        code = _ORACLE.format(tests=os.path.dirname(__file__))
        proc = subprocess.run([sys.executable, "-c", code, str(n), str(reset)], preexec_fn=cgroup.add_self, check=False,
                              capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
        if proc.returncode != 0 and "memory.peak" in proc.stderr:
            pytest.skip("this kernel cannot reset a cgroup v2 memory.peak (Linux < 6.12), so the oracle has no warm-step peak")
        assert proc.returncode == 0, proc.stderr[-2000:]
        return cgroup.peak_bytes()
    finally:
        cgroup.remove()


_PROBE = """
import sys, torch
sys.path.insert(0, {tests!r})
from test_memory_plan import _Convs
from hetero_strategy.balance.probe import probe_step_cost
torch.set_num_threads(1)
model, x = _Convs(), torch.randn(64, 3, 48, 48)
cost = probe_step_cost(model, lambda b: model(b).pow(2).mean(), [(x, 64), (x[:32], 32)], steps=1, exchange=False)
print(cost.memory.per_sample_bytes)
"""


def _probed_per_sample() -> float:
    """The probe in a fresh process, as a rank runs it (this test process carries other tests' caches)."""
    proc = subprocess.run([sys.executable, "-c", _PROBE.format(tests=os.path.dirname(__file__))], check=False,
                          capture_output=True, text=True, timeout=120, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-2000:]
    return float(proc.stdout.split()[-1])


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root: the oracle is the kernel's own peak of a memory cgroup, which only root may create")
def test_the_probes_bytes_per_sample_are_within_20pct_of_the_kernels_growth():
    probed = statistics.median(_probed_per_sample() for _ in range(3))  # each in a fresh process
    # the oracle: other processes, warm, at two other batch sizes, measured by the kernel's cgroup accounting
    # (the median of 3 each)
    kernel = (statistics.median(_kernel_peak(80) for _ in range(3)) -
              statistics.median(_kernel_peak(24) for _ in range(3))) / 56
    assert probed == pytest.approx(kernel, rel=0.2)
    assert kernel > 0.5 * MB  # the model really grows with the batch
