"""``hetero-strategy config``: driven through a pseudo-terminal, by flags and by an answers file.

Oracles: Accelerate's own config loader and ``accelerate launch`` (the file must start N ranks that
see each other), ``HeteroConfig.from_yaml``, the values typed at the prompt, the capacity formula of
docs/design.md semantics 4 computed by hand, and the split of docs/design.md semantics 1 (G = B x world).
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pexpect
import pytest
import yaml
from accelerate.commands.config.config_args import ClusterConfig, load_config_from_file
from accelerate.utils import DistributedType
from dist_utils import free_port

from hetero_strategy.cli import main as cli_main
from hetero_strategy.config import HeteroConfig

WIZARD = str(Path(sys.executable).with_name("hetero-strategy"))
TRAIN_SCRIPT = Path(__file__).parent / "scripts" / "wizard_train.py"
DOWN, UP, ENTER, CLEAR = "\x1b[B", "\x1b[A", "\r", "\x15"  # arrow keys (vt100), Enter, Ctrl-U (clear line)
# CUDA hidden: the device default is then CPU on any machine, so the key presses below mean the same.
PTY_ENV = dict(os.environ, TERM="xterm", PROMPT_TOOLKIT_NO_CPR="1", CUDA_VISIBLE_DEVICES="", NO_COLOR="1")


def _spawn(out: Path) -> pexpect.spawn:
    child = pexpect.spawn(WIZARD, ["config", "--output-dir", str(out)], env=PTY_ENV, dimensions=(50, 220),
                          encoding="utf-8", timeout=60)
    return child


def _reply(child: pexpect.spawn, question: str, keys: str) -> None:
    """Wait until the text is on screen (the prompt reads keys then), then press the keys.

    NOTE: prompt_toolkit redraws only what changed, so a text is found in the stream only the
    first time a prompt shows it: one bad answer per question, or the second reason is unreadable.
    """
    child.expect_exact(question)
    child.send(keys)


def _finish(child: pexpect.spawn) -> str:
    child.expect(pexpect.EOF)
    child.close()
    assert child.exitstatus == 0, child.before
    return child.before


def _configs(out: Path) -> tuple[ClusterConfig, HeteroConfig]:
    return load_config_from_file(str(out / "accelerate.yaml")), HeteroConfig.from_yaml(out / "hetero.yaml")


def _run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = cli_main(["config", *argv])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_pty_cpu_two_processes(tmp_path):
    child = _spawn(tmp_path)
    _reply(child, "In which compute environment", ENTER)                  # This machine
    _reply(child, "Which type of machine", ENTER)                         # CPU
    # Text prompts start empty (the default is a grey hint): what is typed is the whole answer.
    _reply(child, "How many processes should be used", "2" + ENTER)      # not "22"
    _reply(child, "from a cluster profile", ENTER)                        # no profile
    _reply(child, "Link tier of each rank", "ib, eth1g" + ENTER)
    _reply(child, "How should the global batch be split", DOWN + ENTER)   # capacities
    _reply(child, "Relative capacity of each rank", "3,1" + ENTER)        # not "1.0, 1.03,1" (issue 32)
    # Mixed tiers put the default on tiered; one up from there is topk (none, topk, tiered, ...).
    _reply(child, "Which gradient compression", UP + ENTER)
    _reply(child, "online calibration", "y")
    text = _finish(child)

    acc, het = _configs(tmp_path)
    assert acc.distributed_type == DistributedType.MULTI_GPU and acc.use_cpu is True  # see writers.py
    assert (acc.num_processes, acc.num_machines, acc.mixed_precision) == (2, 1, "no")
    assert het.balance.capacities == [3.0, 1.0] and het.balance.batch_sizes is None
    assert het.compression.tiers == ["ib", "eth1g"] and het.compression.method == "topk"
    assert het.calibration.calibrate is True
    assert (f"HETERO_STRATEGY_CONFIG={tmp_path}/hetero.yaml ACCELERATE_USE_CPU=true accelerate launch "
            f"--config_file {tmp_path}/accelerate.yaml train.py") in text
    assert f'Trainer(strategy=HeteroStrategy(config="{tmp_path}/hetero.yaml")' in text
    # It ends by checking its own file, then prints the launch lines last.
    assert text.index(f"check: {tmp_path}/hetero.yaml is valid") < text.index("Launch with Accelerate:")


def test_pty_bad_answers_are_asked_again(tmp_path):
    child = _spawn(tmp_path)
    _reply(child, "In which compute environment", ENTER)
    _reply(child, "Which type of machine", ENTER)
    _reply(child, "How many processes should be used", "abc" + ENTER)
    _reply(child, "num_processes='abc' is invalid: enter an integer >= 1", CLEAR + "2" + ENTER)
    _reply(child, "from a cluster profile", ENTER)
    _reply(child, "Link tier of each rank", "ib, fast" + ENTER)
    # The reason is CompressionConfig's own message, not a second validator's.
    _reply(child, "tiers[1]='fast' is invalid: choose one of nvlink, ib, eth10g, eth1g", CLEAR + "eth10g" + ENTER)
    _reply(child, "How should the global batch be split", DOWN + ENTER)
    _reply(child, "Relative capacity of each rank", "2" + ENTER)
    # BalanceConfig.check_world_size's message: the wrong count is refused with the job's rank count.
    _reply(child, "has 1 entry but the job has 2 ranks; give exactly 2 entries", CLEAR + "2, 1" + ENTER)
    _reply(child, "Which gradient compression", ENTER)
    _reply(child, "online calibration", ENTER)
    _finish(child)

    acc, het = _configs(tmp_path)
    assert acc.num_processes == 2
    assert het.compression.tiers == ["eth10g", "eth10g"]  # one tier given: every rank's
    assert het.balance.capacities == [2.0, 1.0]


# Enter at every question == --defaults, and the line it prints runs 2 ranks: tests/test_docs_site.py
# (test_accelerate_quickstart_through_the_wizard_defaults), with the Accelerate quickstart's script.


def test_one_process_is_warned_about(tmp_path, capsys):
    warning = "warning: num_processes=1 starts one process: that is not distributed training"
    rc, out, err = _run_cli(capsys, "--defaults", "--device", "cpu", "--num-processes", "1",
                            "--output-dir", str(tmp_path))
    assert rc == 0 and warning in out, out + err
    assert load_config_from_file(str(tmp_path / "accelerate.yaml")).distributed_type == DistributedType.NO
    rc, out, err = _run_cli(capsys, "--defaults", "--device", "cpu", "--output-dir", str(tmp_path))
    assert rc == 0 and "warning" not in out, out


def test_answers_file_multi_node(tmp_path, capsys):
    answers = {"compute_environment": "multi_node", "num_machines": 2, "machine_rank": 1,
               "main_process_ip": "10.0.0.1", "main_process_port": 29555, "device": "gpu", "num_processes": 4,
               "tiers": "ib, ib, eth1g, eth1g", "batch_sizes": [8, 8, 4, 4], "compression": "topk",
               "calibrate": True}
    path = tmp_path / "answers.yaml"
    path.write_text(yaml.safe_dump(answers))
    rc, out, err = _run_cli(capsys, "--answers", str(path), "--output-dir", str(tmp_path), "--script", "fit.py")
    assert rc == 0, err

    acc, het = _configs(tmp_path)
    assert acc.distributed_type == DistributedType.MULTI_GPU and acc.use_cpu is False
    assert (acc.num_machines, acc.machine_rank, acc.num_processes) == (2, 1, 4)
    assert (acc.main_process_ip, acc.main_process_port) == ("10.0.0.1", 29555)
    assert het.balance.batch_sizes == [8, 8, 4, 4] and het.balance.capacities is None  # balance implied
    assert het.compression.tiers == ["ib", "ib", "eth1g", "eth1g"] and het.compression.method == "topk"
    assert het.calibration.calibrate is True
    assert (f"HETERO_STRATEGY_CONFIG={tmp_path}/hetero.yaml accelerate launch --config_file "
            f"{tmp_path}/accelerate.yaml fit.py") in out
    assert "devices=2, num_nodes=2" in out  # Lightning counts devices per machine


def test_answers_file_sharded_writes_accelerates_fsdp2_file(tmp_path, capsys):
    path = tmp_path / "answers.yaml"
    path.write_text(yaml.safe_dump({"device": "gpu", "num_processes": 4, "parallelism": "sharded",
                                    "capacities": [2, 2, 1, 1]}))
    rc, out, err = _run_cli(capsys, "--answers", str(path), "--output-dir", str(tmp_path))
    assert rc == 0, err
    acc, het = _configs(tmp_path)
    assert acc.distributed_type == DistributedType.FSDP and acc.fsdp_config["fsdp_version"] == 2
    assert het.compression.method == "none" and het.balance.capacities == [2, 2, 1, 1]
    assert f'Trainer(strategy=HeteroFSDPStrategy(config="{tmp_path}/hetero.yaml")' in out


@pytest.mark.parametrize(("answers", "reason"), [
    ({"compute_environment": "multi_node", "main_process_ip": "h", "num_processes": 3},
     "num_processes=3 is invalid: Accelerate starts num_processes / num_machines"),
    ({"num_processes": 2, "capacities": [1, 2, 3]}, "capacities=[1, 2, 3] is invalid: has 3 entries"),
    ({"num_processes": 2, "balance": "probe", "capacities": [1, 2]}, "capacities=[1, 2] is invalid: that question"),
    ({"threads": 4}, "threads=4 is invalid: unknown question"),
    ({"device": "tpu"}, "device='tpu' is invalid: choose one of cpu, gpu"),
    ({"compute_environment": "multi_node"}, "main_process_ip has no default"),
    ({"device": "gpu", "num_processes": 2, "parallelism": "sharded", "compression": "topk"},
     "compression='topk' is invalid: that question"),
    ({"device": "cpu", "parallelism": "sharded"}, "parallelism='sharded' is invalid: that question"),
])
def test_answers_file_refuses_bad_answers(tmp_path, capsys, answers, reason):
    path = tmp_path / "answers.yaml"
    path.write_text(yaml.safe_dump(answers))
    rc, _, err = _run_cli(capsys, "--answers", str(path), "--output-dir", str(tmp_path))
    assert rc == 2 and reason in " ".join(err.split())
    assert not (tmp_path / "hetero.yaml").exists()


def _profile(path: Path, ranks: list[tuple[float, float, str]]) -> Path:
    """A profile JSON in the format `hetero-strategy profile --json` writes (the fields load_profile reads)."""
    data = {"schema": "hetero_strategy.cluster_profile/1", "world_size": len(ranks),
            "ranks": [{"rank": r, "compute_score": c, "bandwidth_gbit_s": bw, "tier": tier}
                      for r, (c, bw, tier) in enumerate(ranks)]}
    path.write_text(json.dumps(data))
    return path


def test_profile_changes_the_proposed_defaults(tmp_path, capsys):
    base = ["--defaults", "--device", "cpu", "--num-processes", "2"]
    assert _run_cli(capsys, *base, "--output-dir", str(tmp_path / "plain"))[0] == 0
    plain = HeteroConfig.from_yaml(tmp_path / "plain" / "hetero.yaml")
    assert plain.compression.method == "none" and plain.compression.tiers is None
    assert plain.balance.capacities is None

    mixed = _profile(tmp_path / "mixed.json", [(1.0, 150.0, "ib"), (0.5, 1.0, "eth1g")])
    assert _run_cli(capsys, *base, "--profile", str(mixed), "--output-dir", str(tmp_path / "mixed"))[0] == 0
    het = HeteroConfig.from_yaml(tmp_path / "mixed" / "hetero.yaml")
    assert het.compression.tiers == ["ib", "eth1g"] and het.compression.method == "tiered"
    # docs/design.md semantics 4 by hand: 0.7 * compute share + 0.3 * bandwidth share.
    expected = [0.7 * (1.0 / 1.5) + 0.3 * (150.0 / 151.0), 0.7 * (0.5 / 1.5) + 0.3 * (1.0 / 151.0)]
    assert het.balance.capacities == pytest.approx(expected, abs=1e-3)

    dense = _profile(tmp_path / "dense.json", [(1.0, 900.0, "nvlink"), (1.0, 900.0, "nvlink")])
    assert _run_cli(capsys, *base, "--profile", str(dense), "--output-dir", str(tmp_path / "dense"))[0] == 0
    het = HeteroConfig.from_yaml(tmp_path / "dense" / "hetero.yaml")
    assert het.compression.method == "none" and het.balance.capacities == [0.5, 0.5]

    three = _profile(tmp_path / "three.json", [(1.0, 1.0, "eth1g")] * 3)
    rc, _, err = _run_cli(capsys, *base, "--profile", str(three), "--output-dir", str(tmp_path / "three"))
    assert rc == 2 and "it measured 3 ranks but the job has 2" in err


def test_live_profiler_proposes_from_its_measurement(tmp_path, capsys, monkeypatch):
    from hetero_strategy.wizard import profiler

    # Short probes: this checks the wiring (spawn 2 ranks, read their JSON back), not the figures.
    monkeypatch.setattr(profiler, "CPU_PROFILE_ARGS", ["--max-bytes", "64KB", "--budget", "0.02", "--matmul-n", "128"])
    rc, _, err = _run_cli(capsys, "--defaults", "--device", "cpu", "--num-processes", "2", "--profile-source", "run",
                          "--output-dir", str(tmp_path))
    assert rc == 0, err
    measured = json.loads((tmp_path / "cluster-profile.json").read_text())
    assert measured["world_size"] == 2
    tiers = [r["tier"] for r in sorted(measured["ranks"], key=lambda r: r["rank"])]
    het = HeteroConfig.from_yaml(tmp_path / "hetero.yaml")
    assert het.compression.tiers == tiers and len(het.balance.capacities) == 2
    assert het.compression.method == ("none" if set(tiers) == {"nvlink"} else "tiered")


def test_printed_command_starts_two_ranks(tmp_path, capsys):
    rc, out, err = _run_cli(capsys, "--defaults", "--device", "cpu", "--num-processes", "2", "--capacities", "3,1",
                            "--main-process-port", str(free_port()), "--output-dir", str(tmp_path),
                            "--script", str(TRAIN_SCRIPT))
    assert rc == 0, err
    (command,) = [line for line in out.splitlines() if line.startswith("HETERO_STRATEGY_CONFIG=")]
    env = {k: v for k, v in os.environ.items() if k not in ("ACCELERATE_USE_CPU", "HETERO_STRATEGY_CONFIG")}
    env.update(PATH=f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}", GLOO_SOCKET_IFNAME="lo",
               CUDA_VISIBLE_DEVICES="", OMP_NUM_THREADS="1")
    # NOTE: a session of its own, so that on a timeout the ranks die with the launcher.
    proc = subprocess.Popen(["bash", "-c", command], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, start_new_session=True)
    try:
        log, _ = proc.communicate(timeout=180)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
    assert proc.returncode == 0, log[-4000:]
    for rank in (0, 1):
        assert re.search(rf"^rank {rank}/2 world 2 type MULTI_CPU$", log, re.MULTILINE), log[-4000:]
        assert f"rank {rank}/2 config {tmp_path}/hetero.yaml capacities=[3.0, 1.0]" in log
        assert f"rank {rank}/2 done" in log
    # Semantics 1 and 4: G = 4 x 2 = 8 split 3:1 as the wizard's capacities say.
    batches = {int(r): set() for r in (0, 1)}
    for rank, size in re.findall(r"^rank (\d)/2 batch (\d+) ", log, re.MULTILINE):
        batches[int(rank)].add(int(size))
    assert batches == {0: {6}, 1: {2}}
