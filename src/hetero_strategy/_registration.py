"""Register ``strategy="hetero"`` with Lightning and Fabric without importing either.

``import hetero_strategy`` must stay cheap and must work where Lightning is absent or unwanted
(an Accelerate job, the hooks on bare DDP). So each registration waits for its framework: when
``lightning.pytorch`` (Trainer) or ``lightning.fabric`` (Fabric) is already imported it happens at
once, otherwise a one-shot import hook runs it right after that package has finished importing
(``import hetero_strategy`` often comes first: isort orders it before ``import lightning``).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Any

__all__ = ["register_when_lightning_loads"]

# framework package -> the adapter that registers itself with it at the end of its import
_ADAPTERS = {"lightning.pytorch": "hetero_strategy.lightning", "lightning.fabric": "hetero_strategy.fabric"}
_NAMES = {"lightning.pytorch": "Lightning", "lightning.fabric": "Fabric"}


def _register(target: str) -> None:
    # The adapter registers itself at the end of its import; when that import is the one that
    # pulled the framework in, it is still running here and will finish the job itself.
    adapter = _ADAPTERS[target]
    if adapter in sys.modules:
        return
    try:
        importlib.import_module(adapter)
    except Exception as e:  # noqa: BLE001 - a broken registration must not break `import lightning`
        warnings.warn(f"hetero_strategy: could not register strategy='hetero' with {_NAMES[target]}: {e!r}",
                      stacklevel=2)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the registration; everything else is the real loader's."""

    def __init__(self, inner: Any, target: str) -> None:
        self._inner, self._target = inner, target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _register(self._target)

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AfterLightning(importlib.abc.MetaPathFinder):
    """Finds each framework package through the other finders and wraps its loader (once each)."""

    def __init__(self, targets: list[str]) -> None:
        self.waiting = list(targets)

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.waiting:
            return None
        self.waiting.remove(fullname)  # one shot; also keeps the lookup below from finding us again
        if not self.waiting:
            sys.meta_path.remove(self)
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None) if finder is not self else None
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader, fullname)
                return spec
        return None


def register_when_lightning_loads() -> None:
    """Register now with each framework already loaded, else right after it loads; a no-op without Lightning."""
    later = []
    for target in _ADAPTERS:
        if sys.modules.get(target) is not None:
            _register(target)
        else:
            later.append(target)
    if later and not any(isinstance(f, _AfterLightning) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLightning(later))
