"""Accelerate adapter: :class:`HeteroPlugin` wires an ``Accelerator`` to hetero's runtime.

Example::

    from accelerate import Accelerator
    from hetero_strategy.accelerate import HeteroPlugin

    accelerator = Accelerator()
    model, optimizer, loader = HeteroPlugin().prepare(accelerator, model, optimizer, loader)
"""

from hetero_strategy.accelerate.loader import HeteroDataLoader, default_loss
from hetero_strategy.accelerate.plugin import HeteroPlugin

__all__ = ["HeteroDataLoader", "HeteroPlugin", "default_loss"]
