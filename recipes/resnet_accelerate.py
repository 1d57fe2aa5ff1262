"""ResNet with Accelerate: ``HeteroPlugin`` in a plain training loop.

One machine, 2 CPU ranks, offline (scikit-learn's digits)::

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 recipes/resnet_accelerate.py --steps 50

With the wizard's files: ``hetero-strategy config`` writes accelerate.yaml and hetero.yaml and prints
the launch line last; run it with the recipe's flags added. The batch split, compression and
calibration then come from hetero.yaml (a flag such as ``--compression`` would override the file's)::

    hetero-strategy config --script recipes/resnet_accelerate.py
    HETERO_STRATEGY_CONFIG=hetero.yaml accelerate launch --config_file accelerate.yaml \\
        recipes/resnet_accelerate.py --data cifar10 --download

Two nodes with torchrun (run on each node; ``--node-rank`` 0 and 1)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr node0 --master-port 29500 \\
        recipes/resnet_accelerate.py --data cifar10 --compression tiered

SLURM (one ``accelerate launch`` per node)::

    srun --nodes 2 --ntasks-per-node 1 --gpus-per-node 4 bash -c 'accelerate launch --num_machines 2 \\
        --num_processes 8 --machine_rank $SLURM_NODEID --main_process_ip $(scontrol show hostnames | head -1) \\
        --main_process_port 29500 recipes/resnet_accelerate.py --data cifar10'

An emulated heterogeneous cluster on one machine (root: namespaces, tc links, CPU quotas; each
rank gets a torchrun-style environment)::

    sudo ACCELERATE_USE_CPU=true hetero-strategy emulate --compute 1.0,0.57 --link 10gbit,100mbit -- \\
        python recipes/resnet_accelerate.py --steps 50

``accelerate launch --cpu --num_processes 2`` starts one process with the current Accelerate; the
``ACCELERATE_USE_CPU=true ... --multi_gpu`` form above starts two gloo ranks.
"""

from __future__ import annotations

import torch
from accelerate_loop import Parts, parser, train
from vision_task import CHANNELS, LR, MOMENTUM, forward_batch, vision_datasets

from hetero_strategy.workloads.resnets import resnet_cifar_stem


def build(args) -> Parts:
    train_set, test_set = vision_datasets(args.data, args.data_dir, args.download)
    model = resnet_cifar_stem(args.arch, in_channels=CHANNELS[args.data], seed=args.seed)
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=args.momentum)
    return Parts(model, optimizer, train_set, test_set, forward_batch)


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data", choices=sorted(CHANNELS), default="digits")
    p.add_argument("--data-dir", default="./data")
    p.add_argument("--download", action="store_true", help="fetch CIFAR-10 into --data-dir if missing")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--momentum", type=float, default=MOMENTUM)
    train(p.parse_args(), build)


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    main()
    exit_now(0)  # results printed: skip the interpreter's teardown, where torch 2.14 can abort gloo ranks
