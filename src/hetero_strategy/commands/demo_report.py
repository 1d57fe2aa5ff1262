"""The demo's figures from its ranks' records, and their three views: the console table, the chart,
and the README's Markdown table (``hetero-strategy demo --summary demo.json``, one renderer).

Every figure is a median over the measured rounds (the rounds after ``warmup_rounds``, when the
hetero split has settled) and comes with its spread: the lowest and highest of the per-round
figures. Definitions of step time, compute, balance and fast-rank idle: :mod:`hetero_strategy.runtime.metrics`.
"""

from __future__ import annotations

import statistics
from pathlib import Path
from typing import Any

__all__ = ["LABELS", "chart", "figures", "markdown", "rows", "speedup"]

LABELS = {"ddp": "plain DDP", "hetero_auto": "hetero"}


def figures(ranks: list[dict], mode: str, warmup_rounds: int) -> dict[str, Any]:
    """One mode's figures over the rounds from ``warmup_rounds`` on (each rank's record, rank order)."""
    from hetero_strategy.runtime.metrics import balance, fast_rank_idle

    def measured(rank: dict, key: str) -> list[float]:
        rec = rank["modes"][mode]
        return [v for v, r in zip(rec[key], rec["round"]) if r >= warmup_rounds]

    rounds = sorted({r for r in ranks[0]["modes"][mode]["round"] if r >= warmup_rounds})
    sizes = [int(statistics.median(measured(rank, "batches"))) for rank in ranks]
    global_batch = sum(rank["modes"][mode]["batches"][0] for rank in ranks)
    per_round = []
    for k in rounds:  # rank 0's clock: every rank steps together under synchronous training
        rec = ranks[0]["modes"][mode]
        per_round.append(global_batch / statistics.median(s for s, r in zip(rec["step_s"], rec["round"]) if r == k))
    step = statistics.median(measured(ranks[0], "step_s"))
    compute = [statistics.median(measured(rank, "compute_s")) for rank in ranks]
    return {
        "samples_per_s": global_batch / step, "samples_per_s_rounds": per_round, "step_s": step,
        "batch_sizes": sizes, "compute_s": compute, "fast_rank_idle_fraction": fast_rank_idle(step, compute, sizes),
        "balance": balance(compute), "accuracy": ranks[0].get("accuracy", {}).get(mode),
    }


def speedup(modes: dict[str, dict]) -> dict[str, Any]:
    """hetero / DDP: the ratio of the medians, and each measured round's own ratio (its spread)."""
    ddp, het = modes["ddp"], modes["hetero_auto"]
    per_round = [h / d for h, d in zip(het["samples_per_s_rounds"], ddp["samples_per_s_rounds"])]
    return {"median": het["samples_per_s"] / ddp["samples_per_s"], "rounds": per_round,
            "min": min(per_round), "max": max(per_round)}


def _spread(values: list[float], fmt: str) -> str:
    return f"{format(min(values), fmt)}–{format(max(values), fmt)}"


def rows(result: dict[str, Any]) -> list[list[str]]:
    """The table's rows (header first), shared by the console table and the README's Markdown."""
    header = ["run", "samples/s (range over rounds)", "vs DDP (range)", "fast rank idle", "balance",
              "batch sizes (median)", "test acc."]
    out = [header]
    ratio = result["speedup"]
    for mode, f in result["modes"].items():
        vs = "1.00x" if mode == "ddp" else f"{ratio['median']:.2f}x ({ratio['min']:.2f}–{ratio['max']:.2f})"
        out.append([LABELS[mode], f"{f['samples_per_s']:.0f} ({_spread(f['samples_per_s_rounds'], '.0f')})", vs,
                    f"{100 * f['fast_rank_idle_fraction']:.0f}%", f"{f['balance']:.2f}",
                    "/".join(map(str, f["batch_sizes"])), f"{f['accuracy']:.3f}"])
    return out


def markdown(result: dict[str, Any]) -> str:
    """The README's demo table and the line under it, from a committed ``demo.json``."""
    table = rows(result)
    lines = ["| " + " | ".join(table[0]) + " |", "|" + "---|" * len(table[0])]
    lines += ["| " + " | ".join(row) + " |" for row in table[1:]]
    measured = result["rounds"] - result["warmup_rounds"]
    lines.append("")
    lines.append(f"Commit {result.get('commit') or 'unknown'}, {result['emulation']} cluster (compute "
                 f"{result['compute']}, link {result['link']}), B={result['batch_per_rank']}: {result['rounds']} "
                 f"rounds of {result['block']} steps per mode, DDP and hetero alternating; figures are medians "
                 f"over the last {measured} rounds, ranges the lowest and highest round; "
                 f"the job (start-up, probe, both trainings) took {result['seconds'] / 60:.1f} min.")
    return "\n".join(lines) + "\n"


def chart(modes: dict[str, dict], path: Path, simulate: bool) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 3.2))
    labels, compute, idle = [], [], []
    for mode, f in modes.items():
        for r, (b, c) in enumerate(zip(f["batch_sizes"], f["compute_s"])):
            labels.append(f"{LABELS[mode]} r{r} (b={b})")
            compute.append(c)
            idle.append(max(0.0, f["step_s"] - c))
    y = list(range(len(labels)))
    ax.barh(y, compute, color="#1f77b4", label="compute")
    ax.barh(y, idle, left=compute, color="#d62728", label="waiting + communication")
    ax.set_yticks(y, labels, fontsize=8)
    ax.invert_yaxis()
    ax.set_xlabel("seconds per step (median of the measured rounds)")
    ax.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=2)
    ax.set_title("Per-rank step: plain DDP vs hetero" + (" [SIMULATED]" if simulate else ""))
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
