"""ResNet with Lightning: ``Trainer(strategy="hetero")`` through LightningCLI.

One machine, 2 CPU ranks, offline (scikit-learn's digits)::

    python recipes/resnet_lightning.py --trainer.accelerator=cpu --trainer.devices=2 --trainer.max_steps=50

A GPU node on CIFAR-10, Top-K compression on slow links, online rebalancing, from a YAML::

    python recipes/resnet_lightning.py --config recipes/configs/resnet_cifar10.yaml \\
        --trainer.strategy.compression=tiered --trainer.strategy.calibrate=true

Two nodes with torchrun (run on each node; ``--node-rank`` 0 and 1)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr node0 --master-port 29500 \\
        recipes/resnet_lightning.py --trainer.num_nodes=2 --trainer.devices=4 --data.data=cifar10

SLURM (``srun`` starts one task per GPU; Lightning reads the SLURM environment)::

    srun --nodes 2 --ntasks-per-node 4 --gpus-per-node 4 python recipes/resnet_lightning.py \\
        --trainer.num_nodes=2 --trainer.devices=4 --data.data=cifar10

An emulated heterogeneous cluster on one machine (root: namespaces, tc links, CPU quotas; each
rank gets a torchrun-style environment)::

    sudo hetero-strategy emulate --compute 1.0,0.57 --link 10gbit,100mbit -- \\
        python recipes/resnet_lightning.py --trainer.accelerator=cpu --trainer.devices=2 --trainer.max_steps=50

Metrics (per-rank batch size, compute time, speed, balance, bytes sent) go to ``logs/`` as CSV;
``--trainer.logger=TensorBoardLogger`` sends them to TensorBoard instead (``pip install tensorboard``). ``--print_config``
prints the full YAML of a run. ``--trainer.strategy=ddp`` runs plain DDP for comparison.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning_task import ClassifierModule, run
from torch.utils.data import DataLoader
from vision_task import CHANNELS, LR, MOMENTUM, forward_batch, vision_datasets

from hetero_strategy.workloads.resnets import resnet_cifar_stem


class ResNetClassifier(ClassifierModule):
    """A torchvision ResNet trained with SGD and momentum.

    Args:
        arch: torchvision name: resnet18, resnet34, resnet50 ...
        in_channels: the images' channels (filled in from the data module).
        lr: SGD learning rate for the global batch.
        momentum: SGD momentum.
        seed: the initial weights' seed (the same on every rank).
    """

    def __init__(self, arch: str = "resnet18", in_channels: int = 1, lr: float = LR, momentum: float = MOMENTUM,
                 seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = resnet_cifar_stem(arch, in_channels=in_channels, seed=seed)

    def forward_batch(self, batch):
        return forward_batch(self.net, batch)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=self.hparams.momentum)


class VisionData(L.LightningDataModule):
    """Digits (offline) or CIFAR-10.

    Args:
        data: "digits" or "cifar10".
        data_dir: where CIFAR-10 lives.
        download: fetch CIFAR-10 into ``data_dir`` if it is missing (once per node, in prepare_data).
        batch_size: the mean per-rank batch; the global batch is this times the number of ranks.
    """

    def __init__(self, data: str = "digits", data_dir: str = "./data", download: bool = False,
                 batch_size: int = 32) -> None:
        super().__init__()
        self.save_hyperparameters()
        if data not in CHANNELS:
            raise ValueError(f"data={data!r} is invalid: choose one of {sorted(CHANNELS)}")
        self.channels = CHANNELS[data]

    def prepare_data(self) -> None:
        if self.hparams.download:  # local rank 0 of each node only: no two ranks write the same files
            vision_datasets(self.hparams.data, self.hparams.data_dir, download=True)

    def setup(self, stage: str) -> None:
        self.train, self.test = vision_datasets(self.hparams.data, self.hparams.data_dir)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.hparams.batch_size, shuffle=True)

    def val_dataloader(self):
        return DataLoader(self.test, batch_size=2 * self.hparams.batch_size)


def link_channels(parser) -> None:
    """The model's stem takes the data's channels, so ``--data.data=cifar10`` is all it takes."""
    parser.link_arguments("data", "model.in_channels", compute_fn=lambda dm: dm.channels, apply_on="instantiate")


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    run(ResNetClassifier, VisionData, links=link_channels)
    exit_now(0)  # results printed: skip the interpreter's teardown, where torch 2.14 can abort gloo ranks
