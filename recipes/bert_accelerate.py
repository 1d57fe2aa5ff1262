"""BERT with Accelerate: ``BertForSequenceClassification`` and ``HeteroPlugin`` in a plain training loop.

One machine, 2 CPU ranks, offline (a tiny BERT on the recipe's own keyword reviews)::

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 recipes/bert_accelerate.py --steps 200

GLUE SST-2 with pretrained bert-base-uncased and the wizard's files: ``hetero-strategy config``
prints the launch line last; run it with the recipe's flags added. The batch split, compression and
calibration then come from hetero.yaml (a flag such as ``--compression`` would override the file's;
the wizard does not ask about precision, hence ``--precision-policy``)::

    hetero-strategy config --script recipes/bert_accelerate.py
    HETERO_STRATEGY_CONFIG=hetero.yaml accelerate launch --config_file accelerate.yaml recipes/bert_accelerate.py \\
        --data sst2 --model bert-base-uncased --lr 2e-5 --precision-policy auto

Two nodes with torchrun (run on each node; ``--node-rank`` 0 and 1)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr node0 --master-port 29500 \\
        recipes/bert_accelerate.py --data sst2 --model bert-base-uncased --lr 2e-5 --compression tiered

SLURM (one ``accelerate launch`` per node)::

    srun --nodes 2 --ntasks-per-node 1 --gpus-per-node 4 bash -c 'accelerate launch --num_machines 2 \\
        --num_processes 8 --machine_rank $SLURM_NODEID --main_process_ip $(scontrol show hostnames | head -1) \\
        --main_process_port 29500 recipes/bert_accelerate.py --data sst2 --model bert-base-uncased'

An emulated heterogeneous cluster on one machine (root: namespaces, tc links, CPU quotas; each
rank gets a torchrun-style environment)::

    sudo ACCELERATE_USE_CPU=true hetero-strategy emulate --compute 1.0,0.57 --link 10gbit,100mbit -- \\
        python recipes/bert_accelerate.py --steps 200
"""

from __future__ import annotations

import torch
from accelerate_loop import Parts, parser, train
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


def build(args) -> Parts:
    tokenizer = text_tokenizer(args.data, args.tokenizer, args.data_dir)
    train_set, test_set = text_datasets(args.data, tokenizer, max_length=args.max_length, data_dir=args.data_dir,
                                        seed=args.seed)
    model = bert_classifier(args.model, vocab_size=len(tokenizer), seed=args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    return Parts(model, optimizer, train_set, test_set, forward_batch, collate_fn=collator(tokenizer))


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data", choices=["keywords", "sst2"], default="keywords")
    p.add_argument("--model", default="tiny", help='"tiny" (offline, random init) or a Hub name')
    p.add_argument("--tokenizer", default="bert-base-uncased", help="the Hub tokenizer for sst2")
    p.add_argument("--data-dir", default=None, help="cache directory for the Hub's files")
    p.add_argument("--max-length", type=int, default=MAX_LENGTH)
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--weight-decay", type=float, default=WEIGHT_DECAY)
    train(p.parse_args(), build)


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    main()
    exit_now(0)  # results printed: skip the interpreter's teardown, where torch 2.14 can abort gloo ranks
