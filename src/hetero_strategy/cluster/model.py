"""A model's cost inputs, from building it on the meta device: parameter shapes and FLOPs per sample.

Nothing is downloaded or allocated: the model and a batch are built under ``torch.device("meta")``
and one forward + backward runs under ``torch.utils.flop_counter.FlopCounterMode`` (which counts
matrix products and convolutions, 2 FLOPs per multiply-add; element-wise work is left out).

Names (the recipes' models, at their usual sizes):

* ``resnet18``, ``resnet34``, ``resnet50``, ``resnet101`` — torchvision, 3x224x224, 1000 classes;
* ``bert-base``, ``bert-large`` — ``transformers``' ``BertForSequenceClassification`` from a
  config object (2 labels), 128 tokens per sample;
* ``module:callable`` — any importable callable returning a module whose
  ``example_input_array`` (Lightning's convention) is a batch, or a ``(module, batch)`` pair;
  it is called under ``torch.device("meta")``.

Example::

    cost = describe_model("resnet50")
    cost.parameters, cost.flops_per_sample / 1e9      # 25557032, 24.3
"""

from __future__ import annotations

import importlib
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch

from hetero_strategy.config.errors import ConfigError, shown

__all__ = ["MODELS", "ModelCost", "describe_model", "model_builder", "model_loss"]

_SEQ = 128


def _resnet(arch: str) -> Callable[[], tuple[torch.nn.Module, Any]]:
    def build() -> tuple[torch.nn.Module, Any]:
        models = _need("torchvision.models", "torchvision")
        return getattr(models, arch)(), torch.zeros(2, 3, 224, 224)
    return build


def _bert(**sizes: int) -> Callable[[], tuple[torch.nn.Module, Any]]:
    def build() -> tuple[torch.nn.Module, Any]:
        tf = _need("transformers", "transformers")
        model = tf.BertForSequenceClassification(tf.BertConfig(num_labels=2, **sizes))
        return model, {"input_ids": torch.zeros(2, _SEQ, dtype=torch.long)}
    return build


MODELS: dict[str, Callable[[], tuple[torch.nn.Module, Any]]] = {
    "resnet18": _resnet("resnet18"), "resnet34": _resnet("resnet34"), "resnet50": _resnet("resnet50"),
    "resnet101": _resnet("resnet101"), "bert-base": _bert(),
    "bert-large": _bert(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, intermediate_size=4096),
}


@dataclass(frozen=True)
class ModelCost:
    name: str
    shapes: tuple[tuple[int, ...], ...]
    """Trainable parameters' shapes, in the module's order."""
    flops_per_sample: float
    """Forward + backward FLOPs of one sample."""
    activation_bytes_per_sample: float = 0.0
    """Bytes forward keeps for backward per sample (parameters left out): the step's memory that
    grows with the batch."""

    @property
    def parameters(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


def _need(module: str, package: str) -> Any:
    try:
        return importlib.import_module(module)
    except ImportError:
        raise ConfigError(f"model needs {package}, which is not installed: pip install "
                          f"'hetero-strategy[recipes]' (or {package})") from None


def _from_path(spec: str) -> Callable[[], tuple[torch.nn.Module, Any]]:
    module_name, _, attr = spec.partition(":")
    try:
        target: Any = importlib.import_module(module_name)
        for part in attr.split("."):
            target = getattr(target, part)
    except Exception as e:  # noqa: BLE001 - any import failure is the user's path: say which and why
        raise ConfigError(f"model={shown(spec)} is invalid: cannot import it ({type(e).__name__}: "
                          f"{str(e)[:200]}); give module:callable importable here, or one of {', '.join(MODELS)}") from None
    if not callable(target):
        raise ConfigError(f"model={shown(spec)} is invalid: {attr} is not callable; give module:callable")

    def build() -> tuple[torch.nn.Module, Any]:
        made = target()
        model, batch = made if isinstance(made, tuple) else (made, getattr(made, "example_input_array", None))
        if not isinstance(model, torch.nn.Module) or batch is None:
            raise ConfigError(f"model={shown(spec)} is invalid: it must return a module with "
                              "example_input_array, or a (module, batch) pair")
        return model, batch
    return build


def _batch_size(batch: Any) -> int:
    first = next(iter(batch.values())) if isinstance(batch, dict) else batch[0] if isinstance(batch, (tuple, list)) else batch
    return int(first.shape[0])


def _loss(out: Any) -> torch.Tensor:
    """A scalar to backpropagate from whatever the forward returned (a tensor, a tuple, a ModelOutput)."""
    if hasattr(out, "logits"):
        out = out.logits
    elif isinstance(out, (tuple, list)):
        out = out[0]
    return out.float().sum()


def model_builder(spec: str) -> Callable[[], tuple[torch.nn.Module, Any]]:
    """What builds ``spec`` (a name of :data:`MODELS` or ``module:callable``): ``() -> (module, batch)``,
    on whatever device is current (the meta device here; the CPU for a probe that times it).

    Raises:
        ConfigError: an unknown name, a path that cannot be imported.
    """
    if spec in MODELS:
        return MODELS[spec]
    if ":" in spec:
        return _from_path(spec)
    raise ConfigError(f"model={shown(spec)} is invalid: choose one of {', '.join(MODELS)}, or give module:callable")


def model_loss(model: torch.nn.Module, batch: Any) -> torch.Tensor:
    """A scalar of one forward on ``batch`` (a tensor, a tuple of inputs or a dict of keywords) to backpropagate."""
    out = model(**batch) if isinstance(batch, dict) else model(*batch) if isinstance(batch, tuple) else model(batch)
    return _loss(out)


def describe_model(spec: str) -> ModelCost:
    """Parameter shapes and FLOPs per sample of a named model or ``module:callable``.

    Raises:
        ConfigError: an unknown name, a path that cannot be imported, a missing package.
    """
    from torch.utils.flop_counter import FlopCounterMode

    build = model_builder(spec)
    try:
        with torch.device("meta"):
            model, batch = build()
            model.train()
            params = {id(p) for p in model.parameters()}
            kept: dict[int, int] = {}  # NOTE: by identity: one tensor saved by two operations is held once

            def pack(t: torch.Tensor) -> torch.Tensor:
                if id(t) not in params and id(t._base) not in params:  # a weight (or its view) is no activation
                    kept[id(t)] = t.numel() * t.element_size()
                return t

            with FlopCounterMode(display=False) as counter, torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
                model_loss(model, batch).backward()
    except ConfigError:
        raise
    except Exception as e:  # noqa: BLE001 - the user's model: say what failed, on one line
        raise ConfigError(f"model={shown(spec)} is invalid: building it and running a step on the meta device failed "
                          f"({type(e).__name__}: {str(e)[:200]}); give a model that runs on any device") from None
    shapes = tuple(tuple(p.shape) for p in model.parameters() if p.requires_grad)
    n = _batch_size(batch)
    return ModelCost(spec, shapes, counter.get_total_flops() / n, sum(kept.values()) / n)
