"""Variable-length samples: deal each global batch out to ranks by predicted time, not by count.

With fixed-size samples a rank's work is its sample count. With text it is the samples' lengths,
so a count-based split of a length-skewed batch leaves ranks waiting on whoever drew the long
ones. Here each step's global batch (the same samples one process would take, semantics 2) is
dealt out longest first, each sample to the rank that would finish it soonest given its share
of the capacity: rank r's predicted time is ``load_r / share_r`` with ``share_r`` its count in
the capacity split. Inside a rank the samples keep the one-process order.

Exactness: any partition of the global batch gives the one-process gradient when each rank's
weight is its part of the loss's denominator (:func:`unit_weights`): for a mean over samples
each sample counts 1, for a mean over tokens each counts its token count.
"""

from __future__ import annotations

from collections.abc import Sequence

from hetero_strategy.balance.sampler import HeteroBatchSampler, StepPlan

__all__ = ["CostedBatchSampler", "deal_by_cost", "unit_weights"]


def deal_by_cost(costs: Sequence[float], shares: Sequence[float], caps: Sequence[int] | None = None
                 ) -> list[list[int]]:
    """Positions (into ``costs``) per rank: longest first to the rank with the earliest predicted
    finish ``(load + cost) / share``; every rank gets at least one sample; ties go to the lower
    position and the lower rank, so every rank computes the same answer. ``caps`` (a per-rank
    memory cap in samples, ``balance.max_batch_sizes``) is never exceeded.

    Example::

        >>> deal_by_cost([9, 1, 1, 1, 1, 1, 1, 1, 1, 1], shares=[1, 1])
        [[0], [1, 2, 3, 4, 5, 6, 7, 8, 9]]
    """
    n, w = len(costs), len(shares)
    if n < w:
        raise ValueError(f"{n} samples cannot give each of {w} ranks one")
    if any(s <= 0 for s in shares) or any(c < 0 for c in costs):
        raise ValueError(f"shares={list(shares)!r} must be > 0 and costs >= 0")
    caps = [n] * w if caps is None else [int(c) for c in caps]
    if sum(caps) < n:
        raise ValueError(f"max_batch_sizes={caps!r} hold {sum(caps)} samples but the batch has {n}")
    order = sorted(range(n), key=lambda i: (-costs[i], i))
    slots: list[list[int]] = [[] for _ in range(w)]
    loads = [0.0] * w
    for i in order:  # O(n w): w is the world size
        r = min((r for r in range(w) if len(slots[r]) < caps[r]),
                key=lambda r: ((loads[r] + costs[i]) / shares[r], r))
        slots[r].append(i)
        loads[r] += costs[i]
    for r in range(w):  # a rank left without work takes the cheapest sample of the fullest rank
        if not slots[r]:
            donor = max(range(w), key=lambda d: (len(slots[d]), -d))
            i = min(slots[donor], key=lambda i: (costs[i], -i))
            slots[donor].remove(i)
            slots[r].append(i)
    return [sorted(s) for s in slots]


def unit_weights(units: Sequence[float], slots: Sequence[Sequence[int]]) -> tuple[list[float], float]:
    """(per-rank units, total): each rank's part of the loss's denominator (``slots`` index ``units``)."""
    per_rank = [float(sum(units[i] for i in s)) for s in slots]
    return per_rank, float(sum(per_rank))


class CostedBatchSampler(HeteroBatchSampler):
    """:class:`HeteroBatchSampler` for variable-cost samples: each step takes the same global batch
    (one process's order), dealt out by :func:`deal_by_cost` with the capacity split in force as
    the ranks' shares; the plan carries each rank's loss units for its reduction weight.

    Args:
        costs: one cost per dataset index (e.g. its token count): what a sample costs to compute.
        units: one loss-denominator unit per dataset index; None counts samples (a mean over
            samples), ``costs`` for a mean over tokens.
        caps: per-rank memory caps in samples (``balance.max_batch_sizes``).
        **kwargs: as for :class:`HeteroBatchSampler`.
    """

    def __init__(self, num_samples: int, batch_sizes: Sequence[int], rank: int | None,
                 costs: Sequence[float], units: Sequence[float] | None = None, caps: Sequence[int] | None = None,
                 **kwargs) -> None:
        super().__init__(num_samples, batch_sizes, rank, **kwargs)
        self.caps = None if caps is None else list(caps)
        if len(costs) != num_samples or (units is not None and len(units) != num_samples):
            raise ValueError(f"sample costs have {len(costs)} entries but the dataset has {num_samples} samples")
        self.costs = [float(c) for c in costs]
        self.units = None if units is None else [float(u) for u in units]
        self._orders: dict[int, list[int]] = {}  # epoch -> one process's order (plans may lag an epoch)

    def _order(self, epoch: int) -> list[int]:
        if epoch not in self._orders:
            current = self.sampler.epoch
            self.sampler.set_epoch(epoch)
            self._orders = {epoch: self.sampler.order().tolist(), **{e: o for e, o in self._orders.items()
                                                                     if e >= epoch - 1}}
            self.sampler.set_epoch(current)
        return self._orders[epoch]

    def slots(self, step_in_epoch: int, epoch: int | None = None) -> list[list[int]]:
        """Dataset indices per rank for one step (each rank's in one-process order)."""
        epoch = self.epoch if epoch is None else epoch
        g = self.global_batch
        batch = self._order(epoch)[step_in_epoch * g:(step_in_epoch + 1) * g]
        shares = self.sizes_at(epoch * self.steps_per_epoch() + step_in_epoch)
        if len(batch) < len(shares):  # a tiny last batch: the count split pads (weight 0)
            sizes = super().plan(step_in_epoch, epoch).sizes
            starts = [sum(sizes[:r]) for r in range(len(sizes))]
            return [batch[s:s + b] for s, b in zip(starts, sizes)]
        dealt = deal_by_cost([self.costs[i] for i in batch], shares, self.caps)
        return [[batch[p] for p in slot] for slot in dealt]

    def plan(self, step_in_epoch: int, epoch: int | None = None) -> StepPlan:
        slots = self.slots(step_in_epoch, epoch)
        sizes = [len(s) for s in slots]
        if self.units is None:  # a mean over samples: the counts are the weights
            return StepPlan(sizes, sum(sizes))
        return StepPlan(sizes, sum(sizes), units=unit_weights(self.units, slots))

    def _step_batches(self, t: int, order) -> list[list[int]]:
        slots = self.slots(t)
        return [s if s else [int(order[t * self.global_batch])] for s in slots]  # padding: weight 0
