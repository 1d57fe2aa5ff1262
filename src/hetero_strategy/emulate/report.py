"""Rich table of an emulated cluster (rank -> compute factor, link, measured bandwidth)."""

from __future__ import annotations

from rich.table import Table

__all__ = ["cluster_table"]


def cluster_table(rows: list[dict]) -> Table:
    simulated = any(r["mode"] == "simulated" for r in rows)
    title = ("Emulated cluster [bold red](SIMULATED: loopback, unshaped links, SIGSTOP duty-cycle compute)"
             if simulated else "Emulated cluster (network namespaces, tc tbf, cgroup CPU quota)")
    table = Table(title=title)
    for col in ("rank", "node", "compute", "core", "link", "tier", "address", "measured Mbit/s"):
        table.add_column(col, justify="right" if col in ("rank", "node", "compute", "core", "measured Mbit/s") else "left")
    for r in rows:
        bw = r["measured_mbit_s"]
        table.add_row(str(r["rank"]), str(r.get("node", r["rank"])), f"{r['compute_factor']:.2f}", str(r["core"]),
                      str(r["link"]),
                      str(r["tier"] or "-"), str(r["address"]), "-" if bw is None else f"{bw:,.1f}")
    return table
