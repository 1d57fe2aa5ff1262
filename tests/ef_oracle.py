"""A hand-written, one-process simulation of tiered Top-K with error feedback (the spec, in plain torch).

Written from ``docs/design.md`` semantics 6 (error feedback: sent_t + residual_t = g_t + gamma *
residual_{t-1}) and 7 (the density schedule), not from the hooks: each member (a rank, or in
hierarchical mode a fast group's leader holding its group's sum) keeps one residual per
parameter; per step and per parameter it sends the Top-K of g + gamma * residual (ties to the
lower index) at its tier's scheduled density, or everything when the exchange of that parameter
goes dense, and the reduced gradient is the sum of what was sent.

The densities are not computed here: :data:`DENSITY` is a table worked out by hand for the one
schedule the tests run (:data:`HAND_CFG`), so a wrong formula in ``hooks/schedule.py`` cannot be
copied into its own oracle.
"""

from __future__ import annotations

import math

import torch

# docs/design.md semantics 8's table: tier -> (tier_factor (None = dense), exchange every, gamma). The
# shipped defaults are plainer (every tier 1.0 / 1 / 1.0); tests pass this table as tier_overrides
# (OVERRIDES) so that skipped exchanges and gamma < 1 stay covered.
TIER_TABLE = {"nvlink": (None, 1, 1.0), "ib": (0.5, 1, 0.9), "eth10g": (0.3, 2, 0.95), "eth1g": (0.1, 5, 0.98)}
OVERRIDES = {t: {"tier_factor": f, "exchange_every": e, "gamma": g} for t, (f, e, g) in TIER_TABLE.items()
             if f is not None}

# The schedule the tiered tests run: base density 0.5, floor 0.01, one dense warm-up step (step 0),
# cosine period T = 6, so step s >= 1 is t = s - 1 steps into the decay.
HAND_CFG = {"base": 0.5, "floor": 0.01, "warmup": 1, "period": 6}
# By hand: cos(pi t / 6) for t = 0..5 is 1, sqrt(3)/2, 1/2, 0, -1/2, -sqrt(3)/2, so the decay
# (1 + cos) / 2 is 1, (2 + sqrt 3)/4 = 0.93301, 3/4, 1/2, 1/4, (2 - sqrt 3)/4 = 0.06699 at steps 1..6.
# base x tier_factor is 0.25 (ib), 0.15 (eth10g), 0.05 (eth1g); times the decay, floored at 0.01:
#   ib:     0.25, 0.23325, 0.1875, 0.125, 0.0625, 0.01675
#   eth10g: 0.15, 0.13995, 0.1125, 0.075, 0.0375, 0.01005  (just above the floor)
#   eth1g:  0.05, 0.04665, 0.0375, 0.025, 0.0125, 0.00335 -> 0.01 (the floor)
_R3 = math.sqrt(3.0)
DENSITY = {
    "ib": {1: 0.25, 2: (2 + _R3) / 16, 3: 0.1875, 4: 0.125, 5: 0.0625, 6: (2 - _R3) / 16},
    "eth10g": {1: 0.15, 2: 0.15 * (2 + _R3) / 4, 3: 0.1125, 4: 0.075, 5: 0.0375, 6: 0.15 * (2 - _R3) / 4},
    "eth1g": {1: 0.05, 2: 0.05 * (2 + _R3) / 4, 3: 0.0375, 4: 0.025, 5: 0.0125, 6: 0.01},
}


def density(step: int, tier: str) -> float:
    """Scheduled density of ``tier`` at ``step`` under :data:`HAND_CFG` (1.0: dense tier or warm-up)."""
    if TIER_TABLE[tier][0] is None or step < HAND_CFG["warmup"]:
        return 1.0
    return DENSITY[tier][step]  # a KeyError past step 6: extend the hand table, do not compute it


def k_for(n: int, d: float) -> int:
    """Entries sent from n at density d: ceil(d x n), at least one; none at density 0 (a skipped exchange)."""
    return 0 if d <= 0 else min(n, max(1, math.ceil(d * n)))


def top_k(acc: torch.Tensor, k: int) -> torch.Tensor:
    """acc with all but its k largest magnitudes zeroed (ties: the lower index wins)."""
    keep = torch.sort(acc.abs(), descending=True, stable=True).indices[:k]
    out = torch.zeros_like(acc)
    out[keep] = acc[keep]
    return out


class TieredEF:
    """Members' residuals and the per-step reduction. ``cfg``: :data:`HAND_CFG`'s keys and sync_every."""

    def __init__(self, tiers: list[str], cfg: dict, whole: dict[int, set[int]] | None = None) -> None:
        if {k: cfg[k] for k in HAND_CFG} != HAND_CFG:
            raise ValueError(f"cfg={cfg} is invalid: the hand-built DENSITY table covers only {HAND_CFG}")
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
                ds.append(0.0 if skip else density(step, tier))
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
