"""A batch sampler giving each rank a contiguous, capacity-sized slice of one global batch.

Global step t of an epoch consumes ``order[t*G:(t+1)*G]`` where ``order`` is what a single
process with batch G would iterate: ``torch.randperm(n, generator=torch.Generator().manual_seed(
seed + epoch))`` when shuffling (the same convention as ``DistributedSampler``), else
``range(n)``. Rank r takes the slice starting at ``sum(b[:r])`` of length ``b[r]``.
Every rank yields the same number of batches per epoch (unequal counts hang DDP). With
``rank=None`` the sampler yields all ranks' slices of each step in turn (W batches per step).

The last partial batch (``drop_last=False``) is split by the same capacities; when it has fewer
samples than ranks, a rank left without a sample gets one padding sample (the batch's first) and
a reduction weight of 0, so it still joins the collective but contributes nothing.
"""

from __future__ import annotations

import bisect
import math
from collections import deque
from collections.abc import Iterator, Sequence

import torch
from torch.utils.data import Sampler

from hetero_strategy.balance.shares import split_batch

__all__ = ["GlobalOrderSampler", "HeteroBatchSampler", "StepPlan"]


class GlobalOrderSampler(Sampler[int]):
    """The order one process with the same seed would iterate; epoch e shuffles with seed + e."""

    def __init__(self, num_samples: int, shuffle: bool = False, seed: int = 0) -> None:
        self.num_samples = int(num_samples)
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def order(self) -> torch.Tensor:
        if not self.shuffle:
            return torch.arange(self.num_samples)  # (n,)
        g = torch.Generator()
        g.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=g)  # (n,)

    def __iter__(self) -> Iterator[int]:
        return iter(self.order().tolist())

    def __len__(self) -> int:
        return self.num_samples


class StepPlan(tuple):
    """(sizes, global_batch[, units]): per-rank sample counts of one step and their sum (0-size
    ranks pad); ``units`` is (per-rank loss units, total) when the weights are not sample counts
    (variable-length samples under a mean over tokens, see ``costed.py``)."""

    __slots__ = ()

    def __new__(cls, sizes: list[int], global_batch: int, units: tuple[list[float], float] | None = None):
        return super().__new__(cls, (sizes, global_batch, units))

    @property
    def sizes(self) -> list[int]:
        return self[0]

    @property
    def global_batch(self) -> int:
        return self[1]

    def __getnewargs__(self):  # pickle and deepcopy rebuild it through __new__
        return tuple(self)

    @property
    def units(self) -> tuple[list[float], float] | None:
        return self[2]

    def weight_parts(self, rank: int) -> tuple[float, float]:
        """(this rank's units, the step's total): b_r and G_t, or its loss units and their sum."""
        if self.units is None:
            return self.sizes[rank], self.global_batch
        per_rank, total = self.units
        return per_rank[rank], total

    def weight(self, rank: int) -> float:
        """This rank's share of the reduced gradient, b_r / G_t (units_r / total with units)."""
        part, total = self.weight_parts(rank)
        return part / total


class HeteroBatchSampler(Sampler[list[int]]):
    """Yields this rank's indices for each global step.

    Args:
        num_samples: length of the (map-style) dataset.
        batch_sizes: per-rank batch sizes; their sum is the global batch G.
        rank: this process's rank; None yields every rank's slice of a step in rank order, for a
            framework that deals batches out to ranks itself (Accelerate's ``BatchSamplerShard``).
        shuffle: follow the user's DataLoader ``shuffle``.
        seed: shuffle seed; epoch e uses ``seed + e``.
        drop_last: drop the last partial global batch, as ``DataLoader(drop_last=True)`` does.

    Example::

        sampler = HeteroBatchSampler(len(ds), batch_sizes=[3, 13], rank=dist.get_rank(), shuffle=True)
        loader = DataLoader(ds, batch_sampler=sampler)
    """

    def __init__(
        self,
        num_samples: int,
        batch_sizes: Sequence[int],
        rank: int | None,
        shuffle: bool = False,
        seed: int = 0,
        drop_last: bool = False,
    ) -> None:
        if rank is not None and not 0 <= rank < len(batch_sizes):
            raise ValueError(f"rank={rank} is invalid: batch_sizes has {len(batch_sizes)} entries")
        self.num_samples = int(num_samples)
        self.rank = rank
        self.drop_last = drop_last
        # NOTE: Lightning calls set_epoch on `loader.batch_sampler.sampler`, not on the batch
        # sampler itself, so the epoch lives in this inner sampler.
        self.sampler = GlobalOrderSampler(num_samples, shuffle, seed)
        # Steps yielded but not yet trained on, oldest first: loaders prefetch, and after a
        # mid-epoch resume Lightning's batch_idx no longer counts from the iterator's start.
        self._yielded: deque[tuple[int, int]] = deque()
        self._next_unyielded = 0  # global step index of the next batch __iter__ will produce
        self._trained = 0  # global step index after the last batch claimed for training (the resume point)
        self._resume_at: int | None = None  # a restored position: __iter__ of its epoch starts there
        # Schedule of splits: batch sizes in force from a global step on (online calibration
        # appends to it; G stays constant so which samples a step consumes never changes).
        self._starts: list[int] = [0]
        self._splits: list[list[int]] = [list(batch_sizes)]

    # ---- schedule --------------------------------------------------------------------
    @property
    def global_batch(self) -> int:
        return sum(self._splits[0])

    @property
    def batch_sizes(self) -> list[int]:
        """The split in force for the latest scheduled step."""
        return list(self._splits[-1])

    def set_batch_sizes(self, sizes: Sequence[int], from_step: int) -> None:
        """Use ``sizes`` from global step ``from_step`` on (a step not yet yielded)."""
        sizes = [int(s) for s in sizes]
        if len(sizes) != len(self._splits[0]) or sum(sizes) != self.global_batch or min(sizes) < 1:
            raise ValueError(f"batch_sizes={sizes!r} is invalid: need {len(self._splits[0])} positive "
                             f"entries summing to the global batch {self.global_batch}")
        if from_step < self._starts[-1]:
            raise ValueError(f"from_step={from_step} is before the last scheduled change {self._starts[-1]}")
        if from_step == self._starts[-1]:
            self._splits[-1] = sizes
        else:
            self._starts.append(from_step)
            self._splits.append(sizes)

    def sizes_at(self, global_step: int) -> list[int]:
        return self._splits[bisect.bisect_right(self._starts, global_step) - 1]

    def state_dict(self) -> dict:
        return {"starts": list(self._starts), "splits": [list(s) for s in self._splits], "epoch": self.epoch,
                "position": self._trained}

    def load_state_dict(self, state: dict) -> bool:
        """Restore the split schedule and the position: the next epoch iterated at that position
        starts with the first batch not trained on (a mid-epoch resume replays nothing).

        A schedule saved under another global batch (the loader's batch size changed) is not this
        run's: the split stays, the position carries over in samples (at most G - 1 of them are
        seen again), and it returns False.
        """
        saved = sum(state["splits"][0])
        if saved != self.global_batch:
            epoch, t = divmod(int(state.get("position", 0)), self.steps_per_epoch(saved))
            self.sampler.set_epoch(int(state.get("epoch", epoch)))
            self.resume_at_samples(epoch, min(t * saved, self.num_samples))
            return False
        self._starts = list(state["starts"])
        self._splits = [list(s) for s in state["splits"]]
        self.sampler.set_epoch(int(state.get("epoch", self.epoch)))
        if "position" in state:
            self.resume_at(int(state["position"]))
        return True

    def resume_at(self, position: int) -> None:
        """Continue from global step ``position`` (epoch ``position // steps_per_epoch()``)."""
        self._trained = self._next_unyielded = position
        self._resume_at = position

    def resume_at_samples(self, epoch: int, samples: int) -> None:
        """Continue ``epoch`` after its first ``samples`` samples, under this sampler's global batch
        (a run resumed with another world size, hence another G: at most G - 1 samples repeat)."""
        self.resume_at(epoch * self.steps_per_epoch() + min(samples // self.global_batch, self.steps_per_epoch()))

    @property
    def position(self) -> tuple[int, int]:
        """(epoch, samples of it trained on) after the last claimed batch."""
        epoch, t = divmod(self._trained, self.steps_per_epoch())
        return epoch, min(t * self.global_batch, self.num_samples)

    # ---- per-step plan ---------------------------------------------------------------
    def steps_per_epoch(self, global_batch: int | None = None) -> int:
        g = global_batch or self.global_batch
        return self.num_samples // g if self.drop_last else math.ceil(self.num_samples / g)

    def plan(self, step_in_epoch: int, epoch: int | None = None) -> StepPlan:
        """Per-rank sizes of step ``step_in_epoch`` of ``epoch`` (default: the current epoch)."""
        epoch = self.epoch if epoch is None else epoch
        sizes = self.sizes_at(epoch * self.steps_per_epoch() + step_in_epoch)
        g = self.global_batch
        g_t = min(g, self.num_samples - step_in_epoch * g)
        if g_t == g:
            return StepPlan(list(sizes), g)
        # Partial last batch: same proportions; ranks may get 0 when g_t < world size.
        return StepPlan(split_batch(g_t, sizes, min_per_rank=1 if g_t >= len(sizes) else 0), g_t)

    @property
    def shuffle(self) -> bool:
        return self.sampler.shuffle

    @property
    def seed(self) -> int:
        return self.sampler.seed

    @property
    def epoch(self) -> int:
        return self.sampler.epoch

    def set_epoch(self, epoch: int) -> None:
        self.sampler.set_epoch(epoch)

    def next_unyielded_step(self) -> int:
        """The first global step whose indices have not been handed out (safe for a new split)."""
        return max(self._next_unyielded, self._starts[-1])

    def next_plan(self) -> StepPlan | None:
        """Plan of the oldest yielded batch not yet claimed (call once per trained batch)."""
        if not self._yielded:
            return None
        epoch, t = self._yielded.popleft()
        self._trained = epoch * self.steps_per_epoch() + t + 1
        return self.plan(t, epoch)

    def __iter__(self) -> Iterator[list[int]]:
        order = self.sampler.order()  # (n,)
        ranks = range(len(self._splits[0])) if self.rank is None else (self.rank,)
        self._yielded.clear()
        first = 0
        if self._resume_at is not None:
            epoch, first = divmod(self._resume_at, self.steps_per_epoch())
            if epoch != self.epoch:
                first = 0
            if epoch <= self.epoch:
                self._resume_at = None
        for t in range(first, self.steps_per_epoch()):
            batches = self._step_batches(t, order)
            self._yielded.append((self.epoch, t))
            self._next_unyielded = self.epoch * self.steps_per_epoch() + t + 1
            for r in ranks:
                yield batches[r]

    def _step_batches(self, t: int, order: torch.Tensor) -> list[list[int]]:
        """Every rank's indices for step ``t``: contiguous slices of the global batch."""
        sizes, g = self.plan(t).sizes, self.global_batch
        out = []
        for r in range(len(sizes)):
            start = t * g + sum(sizes[:r])
            # a rank with 0 samples gets a padding sample with weight 0 (see module docstring)
            out.append([int(order[t * g])] if sizes[r] == 0 else order[start:start + sizes[r]].tolist())
        return out

    def __len__(self) -> int:
        return self.steps_per_epoch() * (len(self._splits[0]) if self.rank is None else 1)
