"""BERT with the Hugging Face ``Trainer``: ``BertForSequenceClassification`` under ``HeteroTrainer``.

One machine, 2 CPU ranks, offline (a tiny BERT on the recipe's own keyword reviews)::

    torchrun --nproc-per-node 2 recipes/bert_hf_trainer.py --steps 200 --cpu

GLUE SST-2 with pretrained bert-base-uncased (through ``datasets``) and the wizard's hetero file, whose
batch split, compression and calibration the run takes (``--compression`` would override the file's)::

    hetero-strategy config
    torchrun --nproc-per-node 4 recipes/bert_hf_trainer.py --hetero-config hetero.yaml \\
        --data sst2 --model bert-base-uncased --lr 2e-5

``--batch-size`` is the Trainer's ``per_device_train_batch_size``: the mean per-rank batch, so the
global batch is batch-size x ranks, split by capacity. Checkpoints every ``--save-steps`` steps go
to ``--output-dir``; ``--resume`` goes on from the last one there.
"""

from __future__ import annotations

import argparse

import numpy as np
from report import final_report
from text_task import LR, MAX_LENGTH, WEIGHT_DECAY, bert_classifier, collator, text_datasets, text_tokenizer


def _accuracy(prediction) -> dict[str, float]:
    return {"accuracy": float((np.argmax(prediction.predictions, axis=-1) == prediction.label_ids).mean())}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", choices=["keywords", "sst2"], default="keywords")
    p.add_argument("--model", default="tiny", help='"tiny" (offline, random init) or a Hub name')
    p.add_argument("--tokenizer", default="bert-base-uncased", help="the Hub tokenizer for sst2")
    p.add_argument("--data-dir", default=None, help="cache directory of the Hub downloads")
    p.add_argument("--max-length", type=int, default=MAX_LENGTH)
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--batch-size", type=int, default=32, help="per_device_train_batch_size (mean per rank)")
    p.add_argument("--lr", type=float, default=LR)
    p.add_argument("--weight-decay", type=float, default=WEIGHT_DECAY)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--compression", default=None, help="none / topk / tiered ... (default: the config's)")
    p.add_argument("--hetero-config", default=None, help="a hetero YAML (hetero-strategy config writes one)")
    p.add_argument("--output-dir", default="hf_trainer_out")
    p.add_argument("--save-steps", type=int, default=0, help="0: no checkpoints")
    p.add_argument("--resume", action="store_true", help="go on from the last checkpoint in --output-dir")
    p.add_argument("--eval-batches", type=int, default=0, help="0: the whole held-out set")
    p.add_argument("--cpu", action="store_true", help="CPU ranks over gloo")
    args = p.parse_args()

    from transformers import TrainingArguments

    from hetero_strategy.config import HeteroConfig
    from hetero_strategy.transformers import HeteroTrainer

    tokenizer = text_tokenizer(args.data, args.tokenizer, args.data_dir)
    train_set, test_set = text_datasets(args.data, tokenizer, max_length=args.max_length, data_dir=args.data_dir,
                                        seed=args.seed)
    if args.eval_batches:
        test_set.rows = test_set.rows[:args.eval_batches * args.batch_size]
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.steps, per_device_train_batch_size=args.batch_size,
        per_device_eval_batch_size=args.batch_size, learning_rate=args.lr, weight_decay=args.weight_decay,
        seed=args.seed, use_cpu=args.cpu, ddp_backend="gloo" if args.cpu else None, report_to="none",
        save_strategy="steps" if args.save_steps else "no", save_steps=args.save_steps or 500,
        logging_steps=max(1, args.steps // 10), disable_tqdm=True)
    flat = {} if args.compression is None else {"compression": args.compression}
    # None: $HETERO_STRATEGY_CONFIG when set, else the defaults (the probe plans the split)
    hetero = HeteroConfig.resolve(args.hetero_config, flat) if args.hetero_config or flat else None
    trainer = HeteroTrainer(model=bert_classifier(args.model, vocab_size=len(tokenizer), seed=args.seed),
                            args=training, train_dataset=train_set, eval_dataset=test_set,
                            data_collator=collator(tokenizer), compute_metrics=_accuracy, hetero=hetero)
    trainer.train(resume_from_checkpoint=True if args.resume else None)
    summary = trainer.hetero.summary()  # collective: every rank
    accuracy = trainer.evaluate()["eval_accuracy"]
    if trainer.is_world_process_zero():
        print(final_report(summary, accuracy, steps=trainer.state.global_step), flush=True)
    trainer.hetero.close()


if __name__ == "__main__":
    from hetero_strategy.dist.exit_guard import exit_now

    main()
    exit_now(0)  # results printed: skip the interpreter's teardown, where torch 2.14 can abort gloo ranks
