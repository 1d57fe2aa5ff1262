"""Lightning adapter: ``HeteroStrategy`` and ``HeteroFSDPStrategy``, registered as ``strategy="hetero"``
(and variants) and ``strategy="hetero_fsdp"`` on import."""

from hetero_strategy.lightning.fsdp import HeteroFSDPStrategy
from hetero_strategy.lightning.strategy import HeteroStrategy

__all__ = ["HeteroFSDPStrategy", "HeteroStrategy", "register"]


def register() -> None:
    """Add "hetero" (and variants) to Lightning's StrategyRegistry; safe to call twice."""
    from lightning.pytorch.strategies import StrategyRegistry

    if "hetero" not in StrategyRegistry:
        HeteroStrategy.register_strategies(StrategyRegistry)
    if "hetero_fsdp" not in StrategyRegistry:
        HeteroFSDPStrategy.register_strategies(StrategyRegistry)


register()
