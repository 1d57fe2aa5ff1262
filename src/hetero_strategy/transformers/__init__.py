"""Hugging Face ``Trainer`` adapter: :class:`HeteroTrainer` (imports transformers and Accelerate).

Example (``torchrun --nproc_per_node 2 train.py``; on CPU add ``use_cpu=True``)::

    from hetero_strategy.transformers import HeteroTrainer

    trainer = HeteroTrainer(model=model, args=TrainingArguments("out", per_device_train_batch_size=8),
                            train_dataset=train, hetero={"batch_sizes": [3, 13]})
    trainer.train()
"""

from hetero_strategy.transformers.trainer import HeteroTrainer

__all__ = ["HeteroTrainer"]
