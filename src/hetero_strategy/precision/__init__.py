"""Per-device mixed precision with coordinated loss scaling (docs/design.md semantics 9); framework-free.

* :mod:`.policy` — which dtype a rank uses (auto by compute capability, names, lists, mappings);
* :mod:`.scaler` — :class:`CoordinatedScaler`: only fp16 ranks scale, unscaled in the comm hook,
  every rank skips the same steps;
* :mod:`.autocast` — :class:`RankPrecision`: autocast in the rank's dtype and the fp32 keep-list.
"""

from hetero_strategy.cluster.devices import DeviceInfo, training_dtype
from hetero_strategy.precision.autocast import RankPrecision
from hetero_strategy.precision.policy import resolve_dtype
from hetero_strategy.precision.scaler import CoordinatedScaler

__all__ = ["CoordinatedScaler", "DeviceInfo", "RankPrecision", "resolve_dtype", "training_dtype"]
