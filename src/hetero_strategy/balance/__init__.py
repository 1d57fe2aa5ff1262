"""Planning: capacities -> per-rank batch sizes, and the batch sampler that applies them."""

from hetero_strategy.balance.sampler import GlobalOrderSampler, HeteroBatchSampler, StepPlan
from hetero_strategy.balance.shares import capacity, least_share, split_batch, split_batch_timed

__all__ = ["GlobalOrderSampler", "HeteroBatchSampler", "StepPlan", "capacity", "least_share", "split_batch",
           "split_batch_timed"]
