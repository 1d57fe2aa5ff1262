"""The wizard's questions, in the order they are asked.

The launcher questions keep Accelerate's own wording (``accelerate/commands/config/cluster.py``) so
that users of ``accelerate config`` recognise them; mixed precision is not asked (Accelerate's
file says "no": hetero picks the autocast dtype per device). The hetero questions follow; when a
cluster profile is given, its measurement is the default of the tier, capacity and compression
questions (:mod:`hetero_strategy.wizard.proposal`).

Example::

    [q.name for q in QUESTIONS]   # the keys of an answers file, and the flags --name-with-dashes
"""

from __future__ import annotations

from hetero_strategy.config import COMPRESSION_METHODS
from hetero_strategy.wizard import checks
from hetero_strategy.wizard.proposal import Proposal, propose, propose_compression
from hetero_strategy.wizard.question import REQUIRED, Answers, Question, as_text

__all__ = ["IMPLIED", "QUESTIONS"]


def _multi_node(a: Answers) -> bool:
    return a.get("compute_environment") == "multi_node"


def _proposal(a: Answers) -> Proposal | None:
    return propose(a["profile"]) if a.get("profile") else None


def _num_processes_message(a: Answers) -> str:
    # Accelerate's wording, with its machine type; its num_processes is the total over all machines.
    kind = "GPU(s)" if a.get("device") == "gpu" else "processes"
    total = " (in total, over all machines)" if _multi_node(a) else ""
    return f"How many {kind} should be used for distributed training{total}?"


def _parse_num_processes(text: str, a: Answers) -> int:
    n = checks.parse_int("num_processes", text, low=1)
    if n % a.num_machines:
        raise ValueError(f"num_processes={n} is invalid: Accelerate starts num_processes / num_machines "
                         f"processes on each machine; give a multiple of num_machines={a.num_machines}")
    return n


def _default_num_processes(a: Answers) -> int:
    # One process per visible GPU, as `accelerate launch` without a config. On CPU two ranks on one
    # machine (one per machine on several): a single process is not distributed, nothing to split.
    if a.get("device") == "gpu":
        return max(a.gpus, 1) * a.num_machines
    return 2 if a.num_machines == 1 else a.num_machines


def _caution_num_processes(n: int, a: Answers) -> str | None:
    if n > 1:
        return None
    return ("num_processes=1 starts one process: that is not distributed training (Accelerate's file says "
            "distributed_type NO), so there is nothing to split across ranks and the hetero settings do nothing; "
            "give 2 or more" + (" (this machine's CPU can run 2)" if a.get("device") != "gpu" else ""))


def _profile_choices(a: Answers) -> list[tuple[str, str]]:
    choices = [("none", "No profile: start from the defaults"),
               ("read", "Read a profile JSON (written by `hetero-strategy profile --json PATH`)")]
    if not _multi_node(a):  # the wizard can only start this machine's ranks
        choices.append(("run", f"Run the profiler now on {a.world_size} process(es) of this machine"))
    return choices


def _default_profile(a: Answers) -> object:
    # NOTE: with profile_source=run the default of `profile` is the measurement itself.
    if a.get("profile_source") == "run":
        from hetero_strategy.wizard.profiler import run_profiler

        return run_profiler(a.output_dir, a.world_size, cpu=a.get("device") != "gpu")
    return REQUIRED


def _default_capacities(a: Answers) -> list[float]:
    p = _proposal(a)
    return p.capacities if p else [1.0] * a.world_size  # equal capacities: plain DDP's even split


def _note_proposal(a: Answers) -> str | None:
    p = _proposal(a)
    return p.describe() if p else None


_COMPRESSION_TITLES = {
    "none": "none: dense all-reduce (fast links)",
    "topk": "topk: Top-K sparsification with error feedback",
    "topk_allreduce": "topk_allreduce: Top-K at indices all ranks share, one all-reduce (bytes do not grow with ranks)",
    "tiered": "tiered: Top-K with each link tier's density and exchange period (mixed links)",
    "onebit": "onebit: sign compression with error feedback",
    "fp16": "fp16: half-precision gradients",
    "bf16": "bf16: bfloat16 gradients",
    "powersgd": "powersgd: PowerSGD low-rank baseline",
    "auto": "auto: measure the link and each codec on this model, pick the fastest to accuracy",
}

QUESTIONS: list[Question] = [
    Question(name="compute_environment", kind="select", message="In which compute environment are you running?",
             choices=lambda a: [("this_machine", "This machine"), ("multi_node", "Multi-node (several machines)")],
             default=lambda a: "this_machine", help="this_machine or multi_node"),
    Question(name="num_machines", kind="text", asked=_multi_node,
             message="How many different machines will you use (use more than 1 for multi-node training)?",
             default=lambda a: 2, parse=lambda t, a: checks.parse_int("num_machines", t, low=2)),
    Question(name="machine_rank", kind="select", asked=_multi_node, message="What is the rank of this machine?",
             choices=lambda a: [(r, str(r)) for r in range(a.num_machines)], default=lambda a: 0),
    Question(name="main_process_ip", kind="text", asked=_multi_node, parse=checks.parse_host,
             message="What is the IP address of the machine that will host the main process?",
             default=lambda a: REQUIRED),
    # Asked for several machines only, as Accelerate does; on one machine a flag may still set it
    # (two jobs on one box need two ports), and without one Accelerate's default 29500 applies.
    Question(name="main_process_port", kind="text", asked=_multi_node, applies=lambda a: True,
             message="What is the port you will use to communicate with the main process?",
             default=lambda a: 29500 if _multi_node(a) else None,
             parse=lambda t, a: checks.parse_int("main_process_port", t, low=1, high=65535)),
    Question(name="device", kind="select", message="Which type of machine are you using?",
             choices=lambda a: [("cpu", "CPU"), ("gpu", "GPU (CUDA)")],
             default=lambda a: "gpu" if a.gpus else "cpu", help="cpu or gpu"),
    Question(name="num_processes", kind="text", message=_num_processes_message, default=_default_num_processes,
             parse=_parse_num_processes, caution=_caution_num_processes, help="total over all machines, as in Accelerate"),
    Question(name="profile_source", kind="select", message="Propose the hetero settings from a cluster profile?",
             choices=_profile_choices, default=lambda a: "none", help="none, read or run"),
    Question(name="profile", kind="text", asked=lambda a: a.get("profile_source") == "read",
             applies=lambda a: a.get("profile_source") in ("read", "run"),
             message="Path of the cluster profile JSON (empty for none)?", default=_default_profile,
             parse=checks.parse_profile, help="written by `hetero-strategy profile --json PATH`"),
    Question(name="tiers", kind="text", note=_note_proposal,
             message="Link tier of each rank (nvlink, ib, eth10g, eth1g; comma-separated, one for all, "
                     "or auto to measure at start-up)?",
             default=lambda a: p.tiers if (p := _proposal(a)) else None, parse=checks.parse_tiers,
             show=lambda v: as_text(v) or "auto"),
    Question(name="balance", kind="select", message="How should the global batch be split across the ranks?",
             choices=lambda a: [("probe", "Probe automatically at start-up (timed steps of the real model)"),
                                ("capacities", "By capacities: the relative speed of each rank"),
                                ("batch_sizes", "By explicit per-rank batch sizes")],
             default=lambda a: "capacities" if _proposal(a) else "probe", help="probe, capacities or batch_sizes"),
    Question(name="capacities", kind="text", asked=lambda a: a.get("balance") == "capacities",
             message="Relative capacity of each rank (comma-separated, e.g. 2, 1)?", default=_default_capacities,
             parse=checks.parse_capacities, show=as_text),
    Question(name="batch_sizes", kind="text", asked=lambda a: a.get("balance") == "batch_sizes",
             message="Batch size of each rank (comma-separated; they sum to the DataLoader's batch_size "
                     "x the number of processes)?", default=lambda a: REQUIRED,
             parse=checks.parse_batch_sizes, show=as_text),
    Question(name="parallelism", kind="select", message="Does every rank hold the whole model, or a shard of it?",
             choices=lambda a: [("replicated", "Replicated (DDP): the whole model on every rank; gradient compression"),
                                ("sharded", "Sharded (FSDP2): parameters, gradients, optimizer state split across ranks")],
             # NOTE: GPUs only: Accelerate 1.16 shards only on GPU-like devices (on CPU it would run DDP)
             asked=lambda a: a.get("device") == "gpu", default=lambda a: "replicated", help="replicated or sharded"),
    Question(name="compression", kind="select", message="Which gradient compression should the comm hook use?",
             asked=lambda a: a.get("parallelism") != "sharded",
             choices=lambda a: [(m, _COMPRESSION_TITLES.get(m, m)) for m in COMPRESSION_METHODS],
             default=lambda a: propose_compression(a.get("tiers")), help=", ".join(COMPRESSION_METHODS)),
    Question(name="calibrate", kind="confirm",
             message="Rebalance the batch shares while training (online calibration)?",
             default=lambda a: False, help="yes or no"),
]

IMPLIED: dict[str, tuple[str, str]] = {
    # An answer to a follow-up question implies the answer that makes it asked: `--profile x.json`
    # alone means "read a profile", `capacities: [2, 1]` alone means "split by capacities".
    "num_machines": ("compute_environment", "multi_node"),
    "machine_rank": ("compute_environment", "multi_node"),
    "main_process_ip": ("compute_environment", "multi_node"),
    "profile": ("profile_source", "read"),
    "capacities": ("balance", "capacities"),
    "batch_sizes": ("balance", "batch_sizes"),
}
