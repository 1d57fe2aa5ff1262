"""Framework-free per-run core: plan, sampler, hook weight, calibration, timing, checkpoint state.

Both integrations (``hetero_strategy.lightning``, ``hetero_strategy.accelerate``) are thin
adapters over :class:`HeteroRuntime`; it also drives bare ``DistributedDataParallel``.
"""

from hetero_strategy.dist import StallError
from hetero_strategy.runtime.core import HeteroRuntime
from hetero_strategy.runtime.metrics import balance
from hetero_strategy.runtime.nonfinite import NonFiniteError
from hetero_strategy.runtime.planner import plan_batch_sizes
from hetero_strategy.runtime.timer import StepTimer

__all__ = ["HeteroRuntime", "NonFiniteError", "StallError", "StepTimer", "balance", "plan_batch_sizes"]
