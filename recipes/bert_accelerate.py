"""BERT with Accelerate: ``BertForSequenceClassification`` and ``HeteroPlugin`` in a plain training loop.

One machine, 2 CPU ranks, offline (a tiny BERT on the recipe's own keyword reviews)::

    ACCELERATE_USE_CPU=true accelerate launch --multi_gpu --num_processes 2 recipes/bert_accelerate.py --steps 200

GLUE SST-2 with pretrained bert-base-uncased and the wizard's files::

    hetero-strategy config
    accelerate launch --config_file accelerate.yaml recipes/bert_accelerate.py --hetero-config hetero.yaml \\
        --data sst2 --model bert-base-uncased --lr 2e-5 --precision-policy auto

Two nodes with torchrun (run on each node; ``--node-rank`` 0 and 1)::

    torchrun --nnodes 2 --node-rank 0 --nproc-per-node 4 --master-addr node0 --master-port 29500 \\
        recipes/bert_accelerate.py --data sst2 --model bert-base-uncased --lr 2e-5 --compression tiered

SLURM (one ``accelerate launch`` per node)::

    srun --nodes 2 --ntasks-per-node 1 --gpus-per-node 4 bash -c 'accelerate launch --num_machines 2 \\
        --num_processes 8 --machine_rank $SLURM_NODEID --main_process_ip $(scontrol show hostnames | head -1) \\
        --main_process_port 29500 recipes/bert_accelerate.py --data sst2 --model bert-base-uncased'

An emulated heterogeneous cluster on one machine (root; slow ranks and slow links)::

    hetero-strategy emulate --preset mixed -- python recipes/bert_accelerate.py --steps 200
"""

from __future__ import annotations

import torch
from accelerate_loop import parser, train
from text_task import bert_classifier, collator, text_datasets


def forward_batch(model, batch):
    out = model(**batch)
    return out.loss, out.logits, batch["labels"]


def main() -> None:
    p = parser(__doc__)
    p.add_argument("--data", choices=["keywords", "sst2"], default="keywords")
    p.add_argument("--model", default="tiny", help='"tiny" (offline, random init) or a Hub name')
    p.add_argument("--tokenizer", default="bert-base-uncased", help="the Hub tokenizer for sst2")
    p.add_argument("--data-dir", default=None, help="cache directory for the Hub's files")
    p.add_argument("--max-length", type=int, default=128)
    p.add_argument("--lr", type=float, default=1e-3)
    p.add_argument("--weight-decay", type=float, default=0.01)
    args = p.parse_args()
    train_set, test_set, tokenizer = text_datasets(args.data, model_name=args.tokenizer, max_length=args.max_length,
                                                   data_dir=args.data_dir, seed=args.seed)
    model = bert_classifier(args.model, vocab_size=len(tokenizer), seed=args.seed)
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=args.weight_decay)
    train(args, model, optimizer, train_set, test_set, forward_batch, collate_fn=collator(tokenizer))


if __name__ == "__main__":
    main()
