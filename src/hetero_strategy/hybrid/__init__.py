"""Hybrid training (issue 14): local-SGD phases with a shrinking sync period, then synchronous DDP.

The phase schedule (:mod:`~hetero_strategy.hybrid.schedule`) moves on when the validation loss
plateaus; the local-step controller (:mod:`~hetero_strategy.hybrid.local_sgd`) lets each rank
take as many local steps as its speed allows and averages the model deltas once per period with
staleness weights; :class:`HybridTraining` ties both to the runtime's events. One concept a
file: :mod:`.staleness` (the weights), :mod:`.period_store` (a period's end, agreed through the
store), :mod:`.anchor` (the averaged tensors), :mod:`.exchange` (the deltas' sum, Top-K with error
feedback), :mod:`.optimizers` (one optimizer state at the switch to synchronous).

This package does not import the runtime: the runtime holds a :class:`HybridTraining` and calls it.
"""

from hetero_strategy.hybrid.exchange import DeltaExchange
from hetero_strategy.hybrid.local_sgd import LocalSGD
from hetero_strategy.hybrid.run import HybridTraining
from hetero_strategy.hybrid.schedule import PhaseSchedule, relative_change
from hetero_strategy.hybrid.staleness import staleness_weights

__all__ = ["DeltaExchange", "HybridTraining", "LocalSGD", "PhaseSchedule", "relative_change", "staleness_weights"]
