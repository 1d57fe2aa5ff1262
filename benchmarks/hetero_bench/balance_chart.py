"""PNG of the balance benchmark: throughput vs the ideal, and each rank's step split into its
measured compute, the bare all-reduce time and the rest (waiting, overhead), per mode."""

from __future__ import annotations

from typing import Any

__all__ = ["balance_chart"]

_LABELS = {"ddp": "DDP", "hetero": "hetero\n(static probe)", "hetero_cal": "hetero\n(calibrated)",
           "hetero_auto": "hetero\n(probe + calibration)", "ddp_powersgd": "DDP +\nPowerSGD",
           "hetero_tiered": "hetero +\ntiered", "best": "best swept\nsplit"}


def balance_chart(result: dict[str, Any], path: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    modes = result["rounds"][-1]["modes"]
    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(12, 4.5))
    names = ["ideal"] + [_LABELS.get(m, m) for m in modes]
    values = [result["ideal_samples_per_s"]] + [result[f"{m}_samples_per_s"] for m in modes]
    if "best_split" in result:
        names.append(f"{_LABELS['best']} {result['best_split']}")
        values.append(result["best_split_samples_per_s"])
    palette = ["#999999", "#d62728", "#1f77b4", "#2ca02c", "#9467bd", "#8c564b", "#e377c2", "#7f7f7f"]
    ax1.bar(names, values, color=palette[: len(values)])
    for x, v in enumerate(values):
        ax1.text(x, v, f"{v:.0f}\n({v / values[0]:.2f}x ideal)", ha="center", va="bottom", fontsize=8)
    ax1.set_ylim(0, max(values) * 1.18)
    ax1.set_ylabel("samples/s (global)")
    ax1.set_title("Throughput (median over rounds)")
    ax1.tick_params(axis="x", labelsize=8)
    t_ar = result["t_ar_s"]
    labels, comp, comm, wait = [], [], [], []
    for m, fig_m in modes.items():
        for r, b in enumerate(fig_m["batch_sizes"]):
            c = fig_m["compute_s"][r]  # measured in the run, waiting for peers excluded
            labels.append(f"{m} r{r} (b={b})")
            comp.append(c)
            comm.append(min(t_ar, max(0.0, fig_m["step_s"] - c)))
            wait.append(max(0.0, fig_m["step_s"] - c - t_ar))
    y = range(len(labels))
    ax2.barh(y, comp, color="#1f77b4", label="compute (measured)")
    ax2.barh(y, comm, left=comp, color="#ff7f0e", label="communication (up to the dense t_ar)")
    ax2.barh(y, wait, left=[a + b for a, b in zip(comp, comm)], color="#d62728", label="waiting / overhead")
    ax2.set_yticks(list(y), labels, fontsize=8)
    ax2.invert_yaxis()
    ax2.set_xlabel("seconds per step (last round; hetero_cal = calibrated from equal shares)", fontsize=8)
    ax2.legend(fontsize=8, loc="upper center", bbox_to_anchor=(0.5, -0.14), ncol=3)
    ax2.set_title("Per-rank step")
    tag = " [SIMULATED]" if result["emulation"] == "simulated" else ""
    fig.suptitle(f"Balance benchmark: compute {result['config']['compute']}, links {result['config']['link']}{tag}")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
