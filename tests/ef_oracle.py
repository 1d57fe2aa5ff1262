"""A hand-written, one-process simulation of tiered Top-K with error feedback (the spec, in plain torch).

Written from DESIGN.md semantics 6-8, not from the hooks: each member (a rank, or in hierarchical
mode a fast group's leader holding its group's sum) keeps one residual per parameter; per step
and per parameter it sends the Top-K of g + gamma * residual (ties to the lower index) at its
tier's scheduled density, or everything when the exchange of that parameter goes dense, and the
reduced gradient is the sum of what was sent.
"""

from __future__ import annotations

import math

import torch

# DESIGN.md semantics 8's table: tier -> (tier_factor (None = dense), exchange every, gamma). The
# shipped defaults are plainer (every tier 1.0 / 1 / 1.0); tests pass this table as tier_overrides
# (OVERRIDES) so that skipped exchanges and gamma < 1 stay covered.
TIER_TABLE = {"nvlink": (None, 1, 1.0), "ib": (0.5, 1, 0.9), "eth10g": (0.3, 2, 0.95), "eth1g": (0.1, 5, 0.98)}
OVERRIDES = {t: {"tier_factor": f, "exchange_every": e, "gamma": g} for t, (f, e, g) in TIER_TABLE.items()
             if f is not None}


def density(step: int, factor: float | None, base: float, floor: float, warmup: int, period: int) -> float:
    if factor is None or step < warmup:
        return 1.0
    t = min(step - warmup, period)
    return min(1.0, max(floor, base * factor * (1 + math.cos(math.pi * t / period)) / 2))


def k_for(n: int, d: float) -> int:
    return 0 if d <= 0 else min(n, max(1, math.ceil(d * n)))


def top_k(acc: torch.Tensor, k: int) -> torch.Tensor:
    """acc with all but its k largest magnitudes zeroed (ties: the lower index wins)."""
    keep = torch.sort(acc.abs(), descending=True, stable=True).indices[:k]
    out = torch.zeros_like(acc)
    out[keep] = acc[keep]
    return out


class TieredEF:
    """Members' residuals and the per-step reduction. ``cfg`` keys: base, floor, warmup, period, sync_every."""

    def __init__(self, tiers: list[str], cfg: dict, whole: dict[int, set[int]] | None = None) -> None:
        # whole[step]: parameters every member sends in full at that compressed step (the link is
        # fast enough that compressing them does not pay), skipping or not
        self.tiers, self.cfg, self.whole = tiers, cfg, whole or {}
        self.residuals: list[dict[int, torch.Tensor]] = [{} for _ in tiers]
        self.sent_entries: list[int] = [0] * len(tiers)

    def mode(self, step: int) -> str:
        c = self.cfg
        if step < c["warmup"]:
            return "warmup"
        every = c["sync_every"]
        return "dense" if every and step > c["warmup"] and step % every == 0 else "compressed"

    def reduce(self, step: int, grads: list[list[torch.Tensor]]) -> list[torch.Tensor]:
        """grads[m][p]: member m's (already sample-weighted) gradient of parameter p; returns the sums."""
        mode, c, w = self.mode(step), self.cfg, len(self.tiers)
        self.sent_entries = [0] * w
        if mode == "warmup" or all(TIER_TABLE[t][0] is None for t in self.tiers):
            self.sent_entries = [sum(g.numel() for g in grads[0])] * w
            return [sum(gs[p] for gs in grads) for p in range(len(grads[0]))]
        out = []
        for p in range(len(grads[0])):
            n = grads[0][p].numel()
            ds = []
            for tier in self.tiers:
                factor, every, _ = TIER_TABLE[tier]
                skip = factor is not None and (step - c["warmup"]) % every != 0
                ds.append(0.0 if skip else density(step, factor, c["base"], c["floor"], c["warmup"], c["period"]))
            whole = mode == "compressed" and p in self.whole.get(step, set())
            sparse = mode == "compressed" and k_for(n, max(ds)) * w < n and not whole
            total = torch.zeros_like(grads[0][p])
            for m, tier in enumerate(self.tiers):
                res = self.residuals[m].get(p, torch.zeros_like(grads[m][p]))
                acc = grads[m][p].add(res, alpha=TIER_TABLE[tier][2])
                k = n if mode == "dense" or whole else k_for(n, ds[m])
                if sparse:
                    sent = top_k(acc.flatten(), k).view_as(acc)
                elif k > 0:
                    sent, k = acc, n
                else:
                    sent = torch.zeros_like(acc)
                self.residuals[m][p] = acc - sent
                self.sent_entries[m] += k
                total += sent
            out.append(total)
        return out
