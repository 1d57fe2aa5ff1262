"""hetero_strategy: data-parallel training for heterogeneous GPU clusters.

``import hetero_strategy`` registers ``strategy="hetero"`` with Lightning::

    import lightning as L
    import hetero_strategy

    trainer = L.Trainer(strategy="hetero", devices=2)
"""

from hetero_strategy.config import ConfigError, HeteroConfig
from hetero_strategy.lightning import HeteroStrategy, register

__all__ = ["ConfigError", "HeteroConfig", "HeteroStrategy", "__version__"]
__version__ = "0.1.0"

register()
