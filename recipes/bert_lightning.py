"""BERT with Lightning: ``BertForSequenceClassification`` under ``strategy="hetero"`` through LightningCLI.

One machine, 2 CPU ranks, offline (a tiny BERT on the recipe's own keyword reviews)::

    python recipes/bert_lightning.py --trainer.accelerator=cpu --trainer.devices=2 --trainer.max_steps=200

GLUE SST-2 with pretrained bert-base-uncased (downloads the model, tokenizer and data once)::

    python recipes/bert_lightning.py --config recipes/configs/bert_sst2.yaml

Two nodes with torchrun (run on each node; ``--node-rank`` 0 and 1)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr node0 --master-port 29500 \\
        recipes/bert_lightning.py --config recipes/configs/bert_sst2.yaml --trainer.num_nodes=2 --trainer.devices=4

SLURM (``srun`` starts one task per GPU; Lightning reads the SLURM environment)::

    srun --nodes 2 --ntasks-per-node 4 --gpus-per-node 4 python recipes/bert_lightning.py \\
        --config recipes/configs/bert_sst2.yaml --trainer.num_nodes=2 --trainer.devices=4

An emulated heterogeneous cluster on one machine (root: namespaces, tc links, CPU quotas; each
rank gets a torchrun-style environment)::

    sudo hetero-strategy emulate --compute 1.0,0.57 --link 10gbit,100mbit -- \\
        python recipes/bert_lightning.py --trainer.accelerator=cpu --trainer.devices=2 --trainer.max_steps=200

Compression, calibration and precision are the strategy's own arguments:
``--trainer.strategy.compression=topk --trainer.strategy.calibrate=true
--trainer.strategy.precision_policy=auto``. Metrics go to ``logs/`` as CSV
(``--trainer.logger=TensorBoardLogger`` after ``pip install tensorboard``); ``--print_config``
prints the full YAML of a run; ``--trainer.strategy=ddp`` runs plain DDP for comparison.
"""

from __future__ import annotations

import lightning as L
import torch
from lightning_task import ClassifierModule, run
from text_task import (
    LR,
    MAX_LENGTH,
    WEIGHT_DECAY,
    bert_classifier,
    collator,
    forward_batch,
    text_datasets,
    text_tokenizer,
)
from torch.utils.data import DataLoader


class BertClassifier(ClassifierModule):
    """``BertForSequenceClassification`` trained with AdamW.

    Args:
        model: "tiny" (2 layers, hidden 64, random init) or a Hub name such as "bert-base-uncased".
        vocab_size: the tokenizer's size, for "tiny" (filled in from the data module).
        lr: AdamW learning rate.
        weight_decay: AdamW weight decay.
        seed: the initial weights' seed (the same on every rank).
    """

    def __init__(self, model: str = "tiny", vocab_size: int = 0, lr: float = LR, weight_decay: float = WEIGHT_DECAY,
                 seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = bert_classifier(model, vocab_size=vocab_size, seed=seed)

    def forward_batch(self, batch):
        return forward_batch(self.net, batch)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=self.hparams.lr, weight_decay=self.hparams.weight_decay)


class TextData(L.LightningDataModule):
    """Keyword reviews (offline) or GLUE SST-2, padded per batch.

    Args:
        data: "keywords" or "sst2".
        tokenizer: the Hub tokenizer for "sst2".
        data_dir: cache directory for the Hub's files.
        max_length: tokens per example at most.
        batch_size: the mean per-rank batch; the global batch is this times the number of ranks.
        seed: the seed the keyword reviews are written from.
    """

    def __init__(self, data: str = "keywords", tokenizer: str = "bert-base-uncased", data_dir: str | None = None,
                 max_length: int = MAX_LENGTH, batch_size: int = 32, seed: int = 0) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.tokenizer = text_tokenizer(data, tokenizer, data_dir)  # its size shapes the model

    def prepare_data(self) -> None:
        if self.hparams.data != "keywords":  # local rank 0 of each node fills the Hub cache once
            self._load()

    def setup(self, stage: str) -> None:
        self.train, self.test = self._load()

    def _load(self):
        h = self.hparams
        return text_datasets(h.data, self.tokenizer, max_length=h.max_length, data_dir=h.data_dir, seed=h.seed)

    def train_dataloader(self):
        return DataLoader(self.train, batch_size=self.hparams.batch_size, shuffle=True,
                          collate_fn=collator(self.tokenizer))

    def val_dataloader(self):
        return DataLoader(self.test, batch_size=2 * self.hparams.batch_size, collate_fn=collator(self.tokenizer))


def link_vocab(parser) -> None:
    """The model's vocabulary is the tokenizer's, so ``--model.vocab_size`` never needs typing."""
    parser.link_arguments("data", "model.vocab_size", compute_fn=lambda dm: len(dm.tokenizer), apply_on="instantiate")


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    run(BertClassifier, TextData, links=link_vocab)
    exit_now(0)  # results printed: skip the interpreter's teardown, where torch 2.14 can abort gloo ranks
