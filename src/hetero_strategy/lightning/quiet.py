"""Lightning's known-harmless output that a hetero run would print on every rank, kept out of the way.

Both hetero strategies call :func:`quiet_lightning` when they are built (before the ``Trainer``
that logs the tip) and :func:`show_epoch_total` in ``setup``; ``hetero-strategy demo`` calls them
for its plain ``"ddp"`` run too. Each filter is as narrow as the message it drops:

* torch >= 2.10 deprecates building ``LeafSpec``; Lightning 2.6's ``CombinedLoader`` still builds one
  for every training loader (``lightning/pytorch/utilities/_pytree.py``): a FutureWarning on every
  rank that no user can act on. Only that warning from that module is ignored.
* Every ``Trainer`` logs a "💡 Tip: ... litlogger" line (an advertisement, not about the run).
* ``RichProgressBar`` (Lightning's default bar when rich is installed, as it is with hetero) shows
  ``max_epochs - 1`` as the last epoch, and ``max_steps`` sets ``max_epochs=-1``: the bar reads
  ``Epoch 0/-2`` (Lightning-AI/pytorch-lightning#21925). It shows the last epoch ``max_steps`` reaches.

Example::

    quiet_lightning()
    trainer = L.Trainer(max_steps=50, ...)
    show_epoch_total(trainer)      # "Epoch 1/1" for 50 steps of 32 batches per epoch
"""

from __future__ import annotations

import logging
import math
import warnings
from typing import Any

__all__ = ["last_epoch", "quiet_lightning", "show_epoch_total"]


class _DropTip(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return "litlogger" not in str(record.msg)


_TIP = _DropTip()


def quiet_lightning() -> None:
    """Drop the two known-harmless Lightning messages in this process (idempotent)."""
    warnings.filterwarnings("ignore", message=r"`isinstance\(treespec, LeafSpec\)` is deprecated",
                            category=FutureWarning, module=r"lightning\.pytorch\.utilities\._pytree")
    # The logger Lightning's rank_zero_info writes to (lightning/pytorch/utilities/rank_zero.py).
    logging.getLogger("lightning.pytorch.utilities.rank_zero").addFilter(_TIP)  # a set: added once


def last_epoch(trainer: Any) -> int | None:
    """Index of the last epoch a ``max_steps`` run reaches; None when there is no such bound."""
    steps, batches = trainer.max_steps, trainer.num_training_batches
    if steps is None or steps < 0 or not batches or math.isinf(batches):
        return None
    # An optimizer step every accumulate_grad_batches batches, and one at an epoch's end.
    per_epoch = math.ceil(batches / max(1, trainer.accumulate_grad_batches))
    return max(0, math.ceil(steps / per_epoch) - 1)


def show_epoch_total(trainer: Any) -> None:
    """Make the trainer's ``RichProgressBar`` show the last epoch of a ``max_steps`` run (idempotent)."""
    from lightning.pytorch.callbacks import RichProgressBar

    bar = getattr(trainer, "progress_bar_callback", None)
    if not isinstance(bar, RichProgressBar) or getattr(bar, "_hetero_epoch_total", False):
        return
    lightning_description = bar._get_train_description

    def description(current_epoch: int) -> str:
        if trainer.max_epochs is None or trainer.max_epochs >= 0:  # a real epoch limit: Lightning's text
            return lightning_description(current_epoch)
        last = last_epoch(trainer)
        text = f"Epoch {current_epoch}" + ("" if last is None else f"/{last}")
        return f"{text:{len(bar.validation_description)}}"  # Lightning's padding (no flicker)

    # NOTE: the method Lightning's own fix (PR #21924) changes; an instance attribute, so only this bar.
    bar._get_train_description = description
    bar._hetero_epoch_total = True
