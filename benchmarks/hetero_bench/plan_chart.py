"""``bench plan``'s chart and console table: predicted against measured step time and bytes per rank."""

from __future__ import annotations

from typing import Any

__all__ = ["plan_chart", "plan_table"]


def _pct(x: float | None) -> str:
    return "-" if x is None else f"{100 * x:+.0f}%"


def plan_table(result: dict[str, Any]) -> Any:
    from rich.table import Table

    table = Table(title="bench plan: predicted vs measured (error = predicted / measured - 1)")
    for col in ("config", "method", "codec", "step s pred", "step s meas [min, max]", "error", "MB/rank pred",
                "MB/rank meas", "error"):
        table.add_column(col)
    for name, c in result["configs"].items():
        for m, v in c["methods"].items():
            spread = v["measured_step_spread_s"] or [0, 0]
            mark = " (1st)" if m in c.get("ranked_first_tied", [c["ranked_first"]]) else ""
            mark += " (fastest)" if m == c["measured_fastest"] else ""
            sent = v["measured_bytes_per_rank"]
            table.add_row(name, m + mark, str(v.get("codec", "")), f"{v['predicted_step_s']:.3f}",
                          f"{v['measured_step_s']:.3f} [{spread[0]:.3f}, {spread[1]:.3f}]", _pct(v["step_error"]),
                          f"{v['predicted_bytes_per_rank'] / 1e6:.2f}", "-" if sent is None else f"{sent / 1e6:.2f}",
                          _pct(v["bytes_error"]))
    return table


def plan_chart(result: dict[str, Any], path: str) -> None:
    """Per configuration, predicted and measured step time of each method (measured: median with its
    [min, max] as an error bar)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    configs = result["configs"]
    fig, axes = plt.subplots(1, len(configs), figsize=(4.6 * len(configs), 4.2), squeeze=False)
    for ax, (name, c) in zip(axes[0], configs.items()):
        methods = list(c["methods"])
        xs = range(len(methods))
        meas = [c["methods"][m]["measured_step_s"] for m in methods]
        lo = [meas[i] - (c["methods"][m]["measured_step_spread_s"] or [meas[i]] * 2)[0] for i, m in enumerate(methods)]
        hi = [(c["methods"][m]["measured_step_spread_s"] or [meas[i]] * 2)[1] - meas[i] for i, m in enumerate(methods)]
        ax.bar([x - 0.2 for x in xs], [c["methods"][m]["predicted_step_s"] for m in methods], 0.4, label="predicted")
        ax.bar([x + 0.2 for x in xs], meas, 0.4, yerr=[lo, hi], capsize=3, label="measured (median)")
        ax.set_xticks(list(xs), methods, rotation=30, ha="right", fontsize=8)
        ax.set_ylabel("step time (s)")
        err = c["max_abs_step_error"]
        ax.set_title(f"{name}\nmax |step error| {100 * err:.0f}%" if err is not None else name, fontsize=9)
        ax.grid(True, axis="y", alpha=0.3)
    axes[0][0].legend(fontsize=8)
    fig.suptitle("bench plan: the planner's step time against the emulated cluster's")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
