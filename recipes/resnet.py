"""ResNet recipe: train a torchvision ResNet with strategy="hetero".

One machine, 2 CPU ranks on the bundled digits (runs anywhere)::

    python recipes/resnet.py --data digits --accelerator cpu --devices 2 --max-steps 20

A GPU node with CIFAR-10 (downloaded by torchvision), compression on slow links::

    python recipes/resnet.py --data cifar10 --accelerator gpu --devices 4 --compression tiered

Several nodes: start the same command on every node under torchrun or SLURM (``--num-nodes N``).
"""

from __future__ import annotations

import argparse

import lightning as L
import torch
from torch.utils.data import DataLoader

import hetero_strategy
from hetero_strategy.workloads.digits import DigitsClassifier, digits_datasets


def cifar10(root: str):
    """CIFAR-10 as (train, test); needs network access the first time."""
    import torchvision
    import torchvision.transforms as T

    norm = T.Normalize((0.4914, 0.4822, 0.4465), (0.247, 0.243, 0.261))
    train_tf = T.Compose([T.RandomCrop(32, padding=4), T.RandomHorizontalFlip(), T.ToTensor(), norm])
    test_tf = T.Compose([T.ToTensor(), norm])
    return (torchvision.datasets.CIFAR10(root, train=True, download=True, transform=train_tf),
            torchvision.datasets.CIFAR10(root, train=False, download=True, transform=test_tf))


class Cifar10Classifier(DigitsClassifier):
    """The digits classifier with a 3-channel stem for CIFAR-10."""

    def __init__(self, arch: str = "resnet18", lr: float = 0.1, momentum: float = 0.9) -> None:
        super().__init__(arch=arch, lr=lr, momentum=momentum)
        self.net.conv1 = torch.nn.Conv2d(3, 64, kernel_size=3, stride=1, padding=1, bias=False)


def main(argv: list[str] | None = None) -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=["digits", "cifar10"], default="digits")
    p.add_argument("--root", default="./data", help="where CIFAR-10 is stored")
    p.add_argument("--arch", default="resnet18")
    p.add_argument("--batch-size", type=int, default=64, help="mean per-rank batch (global = this x ranks)")
    p.add_argument("--accelerator", default="auto")
    p.add_argument("--devices", default="auto")
    p.add_argument("--num-nodes", type=int, default=1)
    p.add_argument("--max-steps", type=int, default=-1)
    p.add_argument("--max-epochs", type=int, default=5)
    p.add_argument("--compression", default="none", help="none, topk, tiered, onebit, fp16, bf16, powersgd")
    p.add_argument("--calibrate", action="store_true", help="rebalance batch shares while training")
    args = p.parse_args(argv)

    L.seed_everything(0, workers=True)
    if args.data == "digits":
        train, test = digits_datasets(size=32)
        model = DigitsClassifier(arch=args.arch, lr=0.05)
    else:
        train, test = cifar10(args.root)
        model = Cifar10Classifier(arch=args.arch)
    devices = int(args.devices) if str(args.devices).isdigit() else args.devices
    strategy = hetero_strategy.HeteroStrategy(compression=args.compression, calibrate=args.calibrate)
    trainer = L.Trainer(accelerator=args.accelerator, devices=devices, num_nodes=args.num_nodes,
                        strategy=strategy, max_steps=args.max_steps, max_epochs=args.max_epochs,
                        logger=False, enable_checkpointing=False, log_every_n_steps=5)
    trainer.fit(model, DataLoader(train, batch_size=args.batch_size, shuffle=True, num_workers=0),
                DataLoader(test, batch_size=256))


if __name__ == "__main__":
    main()
