"""Lightning adapter: ``HeteroStrategy`` and its registration as ``strategy="hetero"`` (on import)."""

from hetero_strategy.lightning.strategy import HeteroStrategy

__all__ = ["HeteroStrategy", "register"]


def register() -> None:
    """Add "hetero" (and variants) to Lightning's StrategyRegistry; safe to call twice."""
    from lightning.pytorch.strategies import StrategyRegistry

    if "hetero" not in StrategyRegistry:
        HeteroStrategy.register_strategies(StrategyRegistry)


register()
