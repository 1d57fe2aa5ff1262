"""hetero_strategy: data-parallel training for heterogeneous GPU clusters.

``import hetero_strategy`` registers ``strategy="hetero"`` with Lightning's Trainer and with
Fabric, lazily: Lightning is not imported by it (each registration runs once its package is), so
the hooks, the runtime and the Accelerate plugin work where Lightning is absent::

    import hetero_strategy
    import lightning as L

    trainer = L.Trainer(strategy="hetero", devices=2)
    fabric = L.Fabric(strategy="hetero", devices=2)        # HeteroFabricStrategy

    from hetero_strategy.accelerate import HeteroPlugin   # Accelerate; no Lightning involved
"""

from typing import Any

from hetero_strategy._registration import register_when_lightning_loads
from hetero_strategy.config import ConfigError, HeteroConfig

__all__ = ["ConfigError", "HeteroConfig", "HeteroFSDPStrategy", "HeteroFabricStrategy", "HeteroStrategy",
           "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    # NOTE: the strategies subclass Lightning's (DDPStrategy, ModelParallelStrategy); importing them imports Lightning.
    if name in ("HeteroStrategy", "HeteroFSDPStrategy"):
        import hetero_strategy.lightning as adapter

        return getattr(adapter, name)
    if name == "HeteroFabricStrategy":  # subclasses Fabric's DDPStrategy: importing it imports Fabric
        import hetero_strategy.fabric as fabric_adapter

        return fabric_adapter.HeteroFabricStrategy
    raise AttributeError(f"module 'hetero_strategy' has no attribute {name!r}")


register_when_lightning_loads()
