"""Lightning Fabric adapter: ``HeteroFabricStrategy``, registered as ``Fabric(strategy="hetero")``
(and variants) on import."""

from hetero_strategy.fabric.strategy import HeteroFabricStrategy

__all__ = ["HeteroFabricStrategy", "register"]


def register() -> None:
    """Add "hetero" (and variants) to Fabric's strategy registry; safe to call twice."""
    from lightning.fabric.strategies import STRATEGY_REGISTRY

    if "hetero" not in STRATEGY_REGISTRY:
        HeteroFabricStrategy.register_strategies(STRATEGY_REGISTRY)


register()
