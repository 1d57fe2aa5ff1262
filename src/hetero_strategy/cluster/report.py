"""Rich tables of a cluster profile."""

from __future__ import annotations

from typing import Any

from rich.table import Table

__all__ = ["profile_tables"]


def _f(v: Any, fmt: str = ".2f") -> str:
    return "-" if v is None else format(v, fmt)


def profile_tables(profile: dict[str, Any]) -> list[Table]:
    label = f" [bold red]({profile['emulated']})" if profile.get("emulated") == "simulated" else (
        f" (emulated: {profile['emulated']})" if profile.get("emulated") else "")
    ranks = Table(title=f"Cluster profile: {profile['world_size']} rank(s){label}")
    for col in ("rank", "device", "dtype", "fp32 TFLOP/s", "bf16", "fp16", "mem GB/s", "compute", "link Gbit/s",
                "tier", "p50 µs", "p99 µs"):
        ranks.add_column(col, justify="left" if col in ("device", "dtype", "tier") else "right")
    for r in profile["ranks"]:
        mm, lat = r["matmul_tflops"], r.get("latency_us") or {}
        ranks.add_row(str(r["rank"]), str(r["device"]["name"])[:28], r["training_dtype"], _f(mm["fp32"], ".3f"),
                      _f(mm.get("bf16"), ".3f"), _f(mm.get("fp16"), ".3f"), _f(r["memory_gbps"], ".1f"),
                      _f(r["compute_score"]), _f(r["bandwidth_gbit_s"], ".3f"), str(r["tier"] or "-"),
                      _f(lat.get("p50_us"), ".0f"), _f(lat.get("p99_us"), ".0f"))
    tables = [ranks]
    if profile["allreduce"]:
        sweep = Table(title="All-reduce (fp32 sum)")
        for col in ("bytes", "time ms", "algbw Gbit/s", "busbw Gbit/s"):
            sweep.add_column(col, justify="right")
        for row in profile["allreduce"]:
            sweep.add_row(f"{row['bytes']:,}", _f(row["time_s"] * 1e3, ".3f"), _f(row["algbw_gbit_s"], ".3f"),
                          _f(row["busbw_gbit_s"], ".3f"))
        tables.append(sweep)
        p2p = Table(title="Point-to-point Gbit/s (row sends to column)")
        p2p.add_column("from \\ to")
        n = len(profile["p2p_gbit_s"])
        for j in range(n):
            p2p.add_column(str(j), justify="right")
        for i, row in enumerate(profile["p2p_gbit_s"]):
            p2p.add_row(str(i), *[_f(v, ".3f") for v in row])
        tables.append(p2p)
    return tables
