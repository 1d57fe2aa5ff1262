"""Register ``strategy="hetero"`` with Lightning without importing Lightning.

``import hetero_strategy`` must stay cheap and must work where Lightning is absent or unwanted
(an Accelerate job, the hooks on bare DDP). So the registration waits for Lightning: when
``lightning.pytorch`` is already imported it happens at once, otherwise a one-shot import hook
runs it right after ``lightning.pytorch`` has finished importing (``import hetero_strategy``
often comes first: isort orders it before ``import lightning``).
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import warnings
from typing import Any

__all__ = ["register_when_lightning_loads"]

_TARGET = "lightning.pytorch"


def _register() -> None:
    # hetero_strategy.lightning registers itself at the end of its import; when that import is the
    # one that pulled Lightning in, it is still running here and will finish the job itself.
    if "hetero_strategy.lightning" in sys.modules:
        return
    try:
        import hetero_strategy.lightning  # noqa: F401 - registers on import
    except Exception as e:  # noqa: BLE001 - a broken registration must not break `import lightning`
        warnings.warn(f"hetero_strategy: could not register strategy='hetero' with Lightning: {e!r}", stacklevel=2)


class _Loader(importlib.abc.Loader):
    """Runs the real loader, then the registration; everything else is the real loader's."""

    def __init__(self, inner: Any) -> None:
        self._inner = inner

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> Any:
        return self._inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self._inner.exec_module(module)
        _register()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


class _AfterLightning(importlib.abc.MetaPathFinder):
    """Finds ``lightning.pytorch`` through the other finders and wraps its loader (once)."""

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> importlib.machinery.ModuleSpec | None:
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)  # one shot; also keeps the lookup below from finding us again
        for finder in sys.meta_path:
            find = getattr(finder, "find_spec", None)
            spec = find(fullname, path, target) if find is not None else None
            if spec is not None:
                if spec.loader is not None:
                    spec.loader = _Loader(spec.loader)
                return spec
        return None


def register_when_lightning_loads() -> None:
    """Register now if Lightning is loaded, else right after it loads; a no-op without Lightning."""
    if sys.modules.get(_TARGET) is not None:
        _register()
    elif not any(isinstance(f, _AfterLightning) for f in sys.meta_path):
        sys.meta_path.insert(0, _AfterLightning())
