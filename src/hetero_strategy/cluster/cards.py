"""The known-card and link-kind table (package data ``cards.yaml``, its sources named there).

Example::

    table = load_cards()
    table.cards["A100-80GB"].peak_tflops()     # 312.0: bf16, its training dtype
    table.links["eth10g"].bytes_per_s          # 1.25e9
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from importlib import resources

import yaml

from hetero_strategy.cluster.cost import Link
from hetero_strategy.cluster.devices import DeviceInfo, training_dtype

__all__ = ["Card", "CardTable", "load_cards"]


@dataclass(frozen=True)
class Card:
    """One card's datasheet figures."""

    name: str
    tflops: dict[str, float]
    """Peak dense TFLOP/s per dtype (fp32, fp16, bf16)."""
    memory_gb: float
    memory_gbps: float
    capability: str
    """CUDA compute capability, e.g. "8.0"."""

    @property
    def dtype(self) -> str:
        """The dtype a rank on this card trains in under ``precision_policy="auto"``."""
        return training_dtype(DeviceInfo.from_facts({"kind": "cuda", "name": self.name,
                                                     "compute_capability": self.capability}))

    def peak_tflops(self) -> float:
        """Peak dense TFLOP/s in the training dtype (fp32 where the table has no figure for it)."""
        return self.tflops.get(self.dtype, self.tflops["fp32"])


@dataclass(frozen=True)
class CardTable:
    cards: dict[str, Card]
    links: dict[str, Link]


@functools.cache
def load_cards() -> CardTable:
    """The shipped table (read once per process)."""
    text = resources.files("hetero_strategy.cluster").joinpath("cards.yaml").read_text()
    data = yaml.safe_load(text)
    cards = {name: Card(name, {k: float(v) for k, v in c["tflops"].items()}, float(c["memory_gb"]),
                        float(c["memory_gbps"]), str(c["capability"])) for name, c in data["cards"].items()}
    links = {name: Link(float(v["gbit_s"]) * 1e9 / 8, float(v["latency_us"]) * 1e-6) for name, v in data["links"].items()}
    return CardTable(cards, links)
