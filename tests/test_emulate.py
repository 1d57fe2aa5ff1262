"""The one-machine heterogeneous cluster: namespaces, tbf links, cgroup quotas, cleanup.

Oracles: the configured rate (bytes over a socket written here, not the emulator's probe), the
kernel's own view (``ip netns``, ``tc``, cgroup files, cpu.stat throttling), and process state.
Real isolation needs root (network namespaces, tc, cgroups): those tests skip only without it.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
from dist_utils import launch_env

from hetero_strategy.emulate import ClusterSpec, EmulatedCluster, EmulatorError, leftovers
from hetero_strategy.emulate.system import cgroup_cpu_root

needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="network namespaces, tc and cgroups need root")
PY = sys.executable

_SPIN = "import time,os\nt=time.perf_counter()\nx=0\nfor i in range({n}): x+=i\nprint(os.environ['RANK'], time.perf_counter()-t)"
_RECV = """
import socket, time
s = socket.create_server(("0.0.0.0", 7100)); print("ready", flush=True)
c, _ = s.accept(); got = 0; t0 = None
while got < {n}:
    d = c.recv(1 << 20)
    if not d: break
    t0 = t0 or time.perf_counter(); got += len(d)
print(got, time.perf_counter() - t0, flush=True)
"""
_SEND = """
import socket, time
for _ in range(100):
    try:
        c = socket.create_connection(("{host}", 7100), timeout=5); break
    except OSError:
        time.sleep(0.05)
c.sendall(b"\\0" * {n}); c.close()
"""


def _mine(cluster: EmulatedCluster) -> list[str]:
    return [x for x in leftovers() if f"hsem-{cluster.tag}-" in x]


def _owned_by(pid: int) -> list[str]:
    return [x for x in leftovers() if f"hsem-{pid}-" in x]


# ---- spec validation (no root needed) -----------------------------------------------------
@pytest.mark.parametrize(("kwargs", "needle"), [
    ({"compute": [1.0, 1.5]}, "compute[1]"),
    ({"compute": [1.0, 0.5], "links": ["1gbit", "2gbit", "3gbit"]}, "links="),
    ({"compute": [1.0], "links": ["10gigs"]}, "link='10gigs'"),
    ({"compute": [1.0], "latency_ms": [0]}, "latency="),
    ({"compute": [1.0], "mtu": 65000}, "mtu=65000 is invalid"),
    ({"compute": [1.0], "mtu": 1500.0}, "mtu=1500.0 is invalid"),
    ({"compute": [1.0], "mtu": 9000, "simulate": True}, "mtu=9000 is invalid with simulate=True"),
    ({"compute": [1.0, 1.0, 1.0], "nodes": [1, 1]}, "nodes=[1, 1] is invalid"),
    ({"compute": [1.0, 1.0, 1.0], "nodes": [1, 2], "links": ["1gbit"] * 3}, "one per node"),
    ({"compute": [1.0, 1.0], "memory": ["1G", "2G", "3G"]}, "memory=['1G', '2G', '3G'] is invalid: give 1 or 2"),
    ({"compute": [1.0], "memory": ["lots"]}, "memory[0]='lots' is invalid: give a size of at least 64M"),
    ({"compute": [1.0], "memory": ["1G"], "simulate": True}, "is invalid with simulate=True"),
])
def test_spec_refuses_bad_values(kwargs, needle):
    with pytest.raises(ValueError, match=None) as err:
        ClusterSpec(**kwargs)
    assert needle in str(err.value)


def test_nodes_give_links_per_node_and_torchrun_variables_per_node():
    spec = ClusterSpec(compute=[1.0, 0.5, 0.5, 0.5], nodes=[1, 3], links=["10gbit", "1gbit"])
    assert spec.node_of == [0, 1, 1, 1] and spec.node_firsts == [0, 1]
    assert spec.links == ["10gbit", "1gbit", "1gbit", "1gbit"]
    assert [spec.tier(k) for k in range(4)] == ["eth10g", "eth1g", "eth1g", "eth1g"]
    cluster = EmulatedCluster(compute=[1.0, 0.5, 0.5, 0.5], nodes=[1, 3], simulate=True)
    env = [cluster.rank_env(k, range(4)) for k in range(4)]
    # what two torchrun agents (--nnodes 2, --nproc-per-node 1 and 3) would set
    assert [(e["RANK"], e["LOCAL_RANK"], e["LOCAL_WORLD_SIZE"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"])
            for e in env] == [("0", "0", "1", "0", "2"), ("1", "0", "3", "1", "2"), ("2", "1", "3", "1", "2"),
                              ("3", "2", "3", "1", "2")]
    # a job made of ranks 1-3 lives on one node of 3
    sub = [cluster.rank_env(k, [1, 2, 3]) for k in (1, 2, 3)]
    assert [(e["RANK"], e["LOCAL_RANK"], e["GROUP_RANK"], e["GROUP_WORLD_SIZE"]) for e in sub] == [
        ("0", "0", "0", "1"), ("1", "1", "0", "1"), ("2", "2", "0", "1")]


def test_without_root_real_isolation_is_refused(monkeypatch):
    monkeypatch.setattr("hetero_strategy.emulate.cluster.is_root", lambda: False)
    with pytest.raises(EmulatorError, match="needs root.*--simulate"):
        EmulatedCluster(compute=[1.0, 0.5]).start()


def test_simulated_cluster_slows_compute_and_says_so():
    with EmulatedCluster(compute=[1.0, 0.4], simulate=True) as cluster:
        assert all(r["mode"] == "simulated" for r in cluster.describe())
        res = cluster.run([PY, "-c", _SPIN.format(n=4_000_000) + "\nimport os;print(os.environ['HETERO_EMULATED'])"],
                          timeout=60)
    assert res.ok, res.outputs
    t = [float(out.split()[1]) for out in res.outputs]
    assert all(out.split()[2] == "simulated" for out in res.outputs)
    assert t[1] / t[0] > 1.5, t  # duty cycle 40%: ideally 2.5x


# ---- real isolation ---------------------------------------------------------------------
@needs_root
def test_builds_namespaces_links_cgroups_and_removes_them():
    with EmulatedCluster(compute=[1.0, 0.5], links=["1gbit", "50mbit"], measure=False, mtu=9000) as cluster:
        names = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True, check=True).stdout
        for net in cluster.nets:
            assert net.netns in names
            link = subprocess.run(["ip", "-n", net.netns, "link", "show", "veth0"],
                                  capture_output=True, text=True, check=True).stdout
            assert " mtu 9000 " in link
            qdisc = subprocess.run(["tc", "-n", net.netns, "qdisc", "show", "dev", "veth0"],
                                   capture_output=True, text=True, check=True).stdout
            assert "tbf" in qdisc
        assert "50Mbit" in subprocess.run(["tc", "-n", cluster.nets[1].netns, "qdisc", "show", "dev", "veth0"],
                                          capture_output=True, text=True, check=True).stdout
        _, version = cgroup_cpu_root()
        path = cluster.cgroups[1].path
        if version == 1:
            quota, period = (path / "cpu.cfs_quota_us").read_text(), (path / "cpu.cfs_period_us").read_text()
            weight, default = int((path / "cpu.shares").read_text()), 1024
        else:
            quota, period = (path / "cpu.max").read_text().split()
            weight, default = int((path / "cpu.weight").read_text()), 100
        # Factor 0.5 over a 10 ms period (short, so a slow rank is not stopped for long stretches).
        assert (int(quota), int(period)) == (5000, 10000)
        assert weight == 64 * default  # the rank owns its core: other processes do not slow it
        assert len(_mine(cluster)) >= 5  # bridge ns + 2 rank ns + 2 cgroups
    assert _mine(cluster) == []


@needs_root
@pytest.mark.parametrize("mtu", [1500, 9000])
def test_tbf_link_rate_within_20_percent_and_gloo_works_across_namespaces(mtu):
    n = 3_000_000  # 0.48 s at 50 Mbit/s: much longer than the 32 KiB token bucket burst
    with EmulatedCluster(compute=[1.0, 1.0], links=["1gbit", "50mbit"], mtu=mtu) as cluster:
        assert cluster.measured_mbit[1] == pytest.approx(50, rel=0.2)
        recv = subprocess.Popen(cluster._argv(1, [PY, "-c", _RECV.format(n=n)]), stdout=subprocess.PIPE, text=True)
        try:
            assert recv.stdout.readline().strip() == "ready"
            sent = cluster.exec(0, [PY, "-c", _SEND.format(host=cluster.nets[1].addr, n=n)], timeout=30)
            assert sent.returncode == 0, sent.stderr
            got, seconds = recv.stdout.readline().split()
        finally:
            recv.kill()
            recv.wait(timeout=5)
        assert int(got) == n
        assert n * 8 / float(seconds) / 1e6 == pytest.approx(50, rel=0.2)
        code = ("import torch, torch.distributed as d; d.init_process_group('gloo'); "
                "x = torch.full((4,), float(d.get_rank() + 1)); d.all_reduce(x); print(x.tolist()); "
                "d.barrier(); d.destroy_process_group()")  # no rank leaves while its peer still talks
        res = cluster.run([PY, "-c", code], timeout=90)
    assert res.ok, res.outputs
    assert all("[3.0, 3.0, 3.0, 3.0]" in out for out in res.outputs)


@needs_root
def test_a_node_is_one_namespace_and_its_ranks_group_as_one_host():
    """nodes=[1, 2]: ranks 1 and 2 share a namespace and a shaped link, rank 0 has its own; the
    hierarchical exchange's host grouping (over real gloo) finds the two nodes."""
    code = ("import os, torch.distributed as d; d.init_process_group('gloo'); "
            "from hetero_strategy.hooks.hierarchy import build_fast_groups; g = build_fast_groups(); "
            "print(os.readlink('/proc/self/ns/net'), g.groups, os.environ['LOCAL_RANK']); "
            "d.barrier(); d.destroy_process_group()")
    with EmulatedCluster(compute=[1.0, 0.5, 0.5], nodes=[1, 2], links=["1gbit", "50mbit"]) as cluster:
        assert len({n.netns for n in cluster.nets}) == 2 and cluster.nets[1] is cluster.nets[2]
        assert cluster.measured_mbit[1] == cluster.measured_mbit[2] == pytest.approx(50, rel=0.2)
        assert [r["node"] for r in cluster.describe()] == [0, 1, 1]
        res = cluster.run([PY, "-c", code], timeout=120)
    assert res.ok, res.outputs
    rows = [out.strip().splitlines()[-1].split(" ", 1) for out in res.outputs]
    assert rows[1][0] == rows[2][0] != rows[0][0]  # network namespaces
    assert all(r[1] == "[[0], [1, 2]] " + str(local) for r, local in zip(rows, (0, 0, 1)))
    assert _mine(cluster) == []


@needs_root
def test_quota_rank_is_slower_and_env_is_torchrun_like():
    code = _SPIN.format(n=6_000_000) + "\nimport json;print(json.dumps({k: os.environ[k] for k in ('WORLD_SIZE', " \
        "'LOCAL_RANK', 'MASTER_ADDR', 'GLOO_SOCKET_IFNAME', 'OMP_NUM_THREADS')}), sorted(os.sched_getaffinity(0)))"
    with EmulatedCluster(compute=[1.0, 0.3], measure=False) as cluster:
        res = cluster.run([PY, "-c", code], timeout=60)
        stat = (cluster.cgroups[1].path / "cpu.stat").read_text()
    assert res.ok, res.outputs
    t = [float(out.split()[1]) for out in res.outputs]
    assert t[1] / t[0] > 1.5, t  # 30% quota: ideally 3.3x (other load on the box only narrows it)
    throttled = dict(line.split() for line in stat.splitlines())
    assert int(throttled.get("nr_throttled", 0)) > 0
    for rank, out in enumerate(res.outputs):
        env = json.loads(out.splitlines()[1].split(" [")[0].rsplit("}", 1)[0] + "}")
        assert env == {"WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "MASTER_ADDR": "10.77.0.1",
                       "GLOO_SOCKET_IFNAME": "veth0", "OMP_NUM_THREADS": "1"}
        assert out.strip().endswith(f"[{cluster.cores[rank]}]")


@needs_root
def test_a_rank_over_its_memory_limit_is_killed_by_the_kernel_and_the_other_is_not():
    # rank 1 may hold 300 MB and touches 600 MB; rank 0 has no limit, only accounting
    code = "import os, torch\nx = torch.ones(150 * 2**20 // 4 * 4)\nprint('touched', x.sum().item())"
    with EmulatedCluster(compute=[1.0, 1.0], memory=["none", "300M"], measure=False) as cluster:
        res = cluster.run([PY, "-c", code], timeout=60)
        slow = cluster.memory_cgroups[1]
        assert cluster.describe()[1]["memory_limit_bytes"] == 300 * 2**20
        assert res.returncodes[1] == -9 and slow.oom_killed()  # SIGKILL from the kernel's OOM killer
        # rank 0's group only accounts: never killed for memory (the emulator may stop it once rank 1 died)
        assert not cluster.memory_cgroups[0].oom_killed() and cluster.memory_cgroups[0].peak_bytes() > 0
    assert _mine(cluster) == []  # the memory cgroups go with the rest


@needs_root
def test_the_working_set_peak_counts_held_memory_and_not_the_page_cache_the_kernel_charges():
    # rank 0 holds 200 MB of its own; rank 1 writes 300 MB to a file and holds nothing. The kernel's
    # charge counts rank 1's page cache; the working set (usage less inactive file cache) does not.
    tmp = Path("/tmp") / f"ws_{os.getpid()}"
    code = ("import os, time\nif os.environ['RANK'] == '0':\n  b = bytearray(200 << 20); b[::4096] = b'x' * len(b[::4096])\n"
            f"else:\n  f = open('{tmp}', 'wb')\n  [f.write(os.urandom(1 << 20)) for _ in range(300)]\n  f.close()\n"
            "time.sleep(0.5)")
    try:
        with EmulatedCluster(compute=[1.0, 1.0], memory=["none", "none"], measure=False) as cluster:
            groups = cluster.memory_cgroups
            for cg in groups:
                cg.reset_peak()
            with groups[0].watch_working_set() as held, groups[1].watch_working_set() as cached:
                res = cluster.run([PY, "-c", code], timeout=60)
            assert res.ok, res.outputs
            assert 200 * 2**20 <= held.peak <= 260 * 2**20, held.peak
            assert groups[1].peak_bytes() >= 300 * 2**20  # the kernel's charge holds the written file
            assert cached.peak <= 100 * 2**20, cached.peak
    finally:
        tmp.unlink(missing_ok=True)


@needs_root
def test_crashed_rank_stops_the_others_and_timeout_is_bounded():
    code = "import os,sys,time\nif os.environ['RANK']=='1': time.sleep(0.3); sys.exit(3)\ntime.sleep(60)"
    with EmulatedCluster(compute=[1.0, 1.0], measure=False) as cluster:
        res = cluster.run([PY, "-c", code], timeout=60)
        assert res.failed_rank == 1 and res.returncode == 3 and res.wall_s < 15
        res = cluster.run([PY, "-c", "import time; time.sleep(60)"], timeout=1.0)
        assert res.timed_out and res.returncode == 124 and res.wall_s < 10
        assert all(not pids for pids in (cg.pids() for cg in cluster.cgroups))
    assert _mine(cluster) == []


@needs_root
def test_cli_mtu_reaches_the_ranks_links_and_a_bad_one_is_refused():
    show = "import subprocess; print(subprocess.run(['ip', 'link', 'show', 'veth0'], capture_output=True, text=True).stdout)"
    cmd = [PY, "-m", "hetero_strategy.cli", "emulate", "--no-measure", "--compute", "1.0,1.0", "--link", "1gbit"]
    ok = subprocess.run([*cmd, "--mtu", "9000", "--", PY, "-c", show], check=False, capture_output=True, text=True,
                        timeout=120)
    assert ok.returncode == 0, ok.stderr
    assert ok.stdout.count(" mtu 9000 ") == 2  # both ranks' veths
    bad = subprocess.run([*cmd, "--mtu", "16000", "--", PY, "-c", "pass"], check=False, capture_output=True, text=True,
                         timeout=60)
    assert bad.returncode == 2 and "--mtu: '16000' is invalid" in bad.stderr and "[576, 9000]" in bad.stderr


def _start_cli(*extra: str) -> subprocess.Popen:
    cmd = [PY, "-m", "hetero_strategy.cli", "emulate", "--no-measure", "--compute", "1.0,0.5", *extra,
           "--", PY, "-c", "import time; time.sleep(120)"]
    return subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def _rank_pids(pid: int, rank: int, timeout: float = 60) -> list[int]:
    root, _ = cgroup_cpu_root()
    procs = root / f"hsem-{pid}-0-r{rank}" / "cgroup.procs"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if procs.exists() and procs.read_text().split():
            return [int(p) for p in procs.read_text().split()]
        time.sleep(0.1)
    raise TimeoutError(f"rank {rank} of emulate {pid} never started")


@needs_root
def test_cli_cleans_up_after_a_killed_rank_sigterm_and_ctrl_c():
    proc = _start_cli()
    try:
        os.kill(_rank_pids(proc.pid, 1)[0], signal.SIGKILL)
        assert proc.wait(timeout=60) != 0
        assert _owned_by(proc.pid) == []
        for sig in (signal.SIGTERM, signal.SIGINT):  # kill(1) / systemd stop, and Ctrl-C
            proc = _start_cli()
            _rank_pids(proc.pid, 0)
            proc.send_signal(sig)
            assert proc.wait(timeout=60) != 0, sig
            assert _owned_by(proc.pid) == []
    finally:
        proc.kill()


_TOOLS = {  # a command that starts ranks on an emulated cluster, and the signal it gets
    "demo": (["demo", "--compute", "1.0,0.5", "--batch", "8", "--rounds", "100", "--block", "5"], signal.SIGTERM),
    "bench": (["bench", "balance", "--compute", "1.0,0.5", "--trainings", "ddp", "--rounds", "1", "--steps", "500",
               "--measure", "2", "--batch", "8", "--framework", "ddp", "--json", os.devnull], signal.SIGHUP),
    "emulate": (["emulate", "--no-measure", "--compute", "1.0,0.5", "--", PY, "-c", "import time; time.sleep(120)"],
                signal.SIGHUP),
}


@needs_root
@pytest.mark.parametrize("tool", list(_TOOLS))
def test_a_signalled_tool_stops_its_ranks_and_removes_its_cluster(tool):
    argv, sig = _TOOLS[tool]
    proc = subprocess.Popen([PY, "-m", "hetero_strategy.cli", *argv], stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE, text=True)
    try:
        ranks = _rank_pids(proc.pid, 0, timeout=90)
        proc.send_signal(sig)
        assert proc.wait(timeout=60) == 128 + sig, proc.stderr.read()[-2000:]
        assert _owned_by(proc.pid) == []
        time.sleep(0.2)
        assert not any(_running(p) for p in ranks)
    finally:
        proc.kill()
        proc.wait()


def test_profile_ends_on_ctrl_c_with_the_usual_code():
    proc = subprocess.Popen([PY, "-m", "hetero_strategy.cli", "profile", "--budget", "30", "--matmul-n", "64"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=launch_env())
    try:
        time.sleep(4)  # inside its probes
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=30) == 130
        assert "interrupted" in proc.stderr.read()
    finally:
        proc.kill()
        proc.wait()


@needs_root
def test_stale_objects_of_a_sigkilled_emulate_are_cleaned_by_the_next():
    proc = _start_cli()
    orphans = _rank_pids(proc.pid, 1)
    proc.kill()  # SIGKILL: no chance to clean up; namespaces and cgroups stay behind
    proc.wait(timeout=10)
    time.sleep(0.5)
    assert not any(_running(p) for p in orphans)  # the ranks died with it (PR_SET_PDEATHSIG)
    assert _owned_by(proc.pid)
    with EmulatedCluster(compute=[1.0], measure=False) as cluster:
        assert any(f"hsem-{proc.pid}-" in x for x in cluster.stale_removed)
        res = cluster.run([PY, "-c", "print('ok')"], timeout=30)
        assert res.ok
    assert _owned_by(proc.pid) == []


def _running(pid: int) -> bool:
    """Alive and not a zombie (orphans are re-parented to an init that may reap them late)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError):
        return False
    return state not in ("Z", "X")


def test_a_job_must_list_each_nodes_ranks_together():
    needle = r"ranks=\[0, 2, 1, 3\] is invalid: list each node's ranks together"
    with EmulatedCluster(compute=[1.0] * 4, nodes=[2, 2], simulate=True) as cluster, \
            pytest.raises(ValueError, match=needle):
        cluster.run([PY, "-c", "pass"], ranks=[0, 2, 1, 3])
