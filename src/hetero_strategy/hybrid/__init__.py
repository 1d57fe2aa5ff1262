"""Hybrid training (issue 14): local-SGD phases with a shrinking sync period, then synchronous DDP.

The phase schedule (:mod:`~hetero_strategy.hybrid.schedule`) moves on when the validation loss
plateaus; the local-step controller (:mod:`~hetero_strategy.hybrid.local_sgd`) lets each rank
take as many local steps as its speed allows and averages the model deltas once per period with
staleness weights; :class:`HybridTraining` ties both to the runtime's events.
"""

from hetero_strategy.hybrid.exchange import DeltaExchange
from hetero_strategy.hybrid.local_sgd import LocalSGD, staleness_weights
from hetero_strategy.hybrid.run import HybridTraining
from hetero_strategy.hybrid.schedule import PhaseSchedule, relative_change

__all__ = ["DeltaExchange", "HybridTraining", "LocalSGD", "PhaseSchedule", "relative_change", "staleness_weights"]
