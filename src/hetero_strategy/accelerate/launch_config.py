"""The ``accelerate launch`` config file for a hetero job, written by Accelerate's own classes.

It holds no hetero key (``accelerate launch`` refuses unknown top-level keys): hetero's settings
travel in their own YAML through ``HETERO_STRATEGY_CONFIG``. The wizard (``hetero-strategy
config``) calls this; it is Accelerate-specific, so it lives with the adapter.

CPU ranks: accelerate 1.15 starts ``distributed_type: MULTI_CPU`` through its simple launcher, i.e.
ONE process unless mpirun is configured, and its multi-GPU launcher does not pass ``use_cpu`` on to
the ranks (they then run alone, DistributedType.NO). What starts N gloo ranks that see each other
is ``distributed_type: MULTI_GPU`` + ``use_cpu: true`` in the file *and* ``ACCELERATE_USE_CPU=true``
in the environment of ``accelerate launch`` (tests/test_wizard.py runs it).

Example::

    cluster_config(num_processes=2, num_machines=1, cpu=True).to_yaml_file("accelerate.yaml")
"""

from __future__ import annotations

from accelerate.commands.config.config_args import ClusterConfig
from accelerate.utils import ComputeEnvironment, DistributedType

__all__ = ["cluster_config"]


def cluster_config(num_processes: int, num_machines: int, cpu: bool, machine_rank: int = 0,
                   main_process_ip: str | None = None, main_process_port: int | None = None,
                   sharded: bool = False) -> ClusterConfig:
    """What ``accelerate config`` would write for this job (see the module docstring for CPU);
    ``sharded``: FSDP2, as ``accelerate config`` writes it (Accelerate shards on GPUs only)."""
    # One process on one machine is Accelerate's "no distributed training"; anything more goes
    # through its multi-GPU (torchrun) launcher, also on CPU.
    distributed = DistributedType.MULTI_GPU if num_processes > 1 or num_machines > 1 else DistributedType.NO
    fsdp = {}
    if sharded:
        distributed = DistributedType.FSDP
        fsdp = {"fsdp_version": 2, "fsdp_auto_wrap_policy": "TRANSFORMER_BASED_WRAP",
                "fsdp_reshard_after_forward": True, "fsdp_state_dict_type": "SHARDED_STATE_DICT",
                "fsdp_cpu_ram_efficient_loading": True, "fsdp_offload_params": False}
    return ClusterConfig(fsdp_config=fsdp,
        compute_environment=ComputeEnvironment.LOCAL_MACHINE, distributed_type=distributed,
        mixed_precision="no",  # hetero picks the autocast dtype per device, not Accelerate
        use_cpu=cpu, debug=False, num_processes=num_processes, machine_rank=machine_rank,
        num_machines=num_machines, gpu_ids="all", main_process_ip=main_process_ip,
        main_process_port=main_process_port, rdzv_backend="static", same_network=True,
        main_training_function="main", enable_cpu_affinity=False, downcast_bf16="no",
        tpu_use_cluster=False, tpu_use_sudo=False, tpu_env=[],
    )
