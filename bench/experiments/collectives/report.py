"""The `collectives` report: an nccl-tests style table, distbench against torch.distributed.

Sections: the bus factors derived, one table per collective (time, algbw, busbw, `wrong`
and the paired ratio distbench busbw ÷ torch busbw per cell), and the busbw plot. The
skeleton (`bench.report.skeleton`) writes the setup, correctness and failed cells.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import seaborn as sns

from bench.experiments.collectives.config import PRIMITIVES
from bench.report import (
    Context,
    Report,
    format_bytes,
    format_ratio,
    format_seconds,
    log2_axis,
    markdown_table,
    new_figure,
    prose,
)

__all__ = ["COLLECTIVE_ORDER", "REPORT"]

COLLECTIVE_ORDER = (*PRIMITIVES, "all_reduce")
IMPLS = ("distbench", "torch")
SAME_RUN = "torch.distributed, same run"


def _collectives(df: pd.DataFrame) -> list[str]:
    present = {str(c) for c in pd.unique(df["collective"])}
    return [c for c in COLLECTIVE_ORDER if c in present] + sorted(present - set(COLLECTIVE_ORDER))


def _wide(ok: pd.DataFrame) -> pd.DataFrame:
    """One row per (collective, N, S); columns `<metric>_<impl>` plus `ratio`, the paired
    ratio (torch timed in windows alternating with distbench's, same cell and buffers)."""
    keys = ["collective", "world_size", "message_bytes"]
    metrics = ["time_s", "algbw_gbps", "busbw_gbps", "wrong"]
    aggregate = {metric: "max" if metric == "wrong" else "median" for metric in metrics}
    wide = ok.pivot_table(index=keys, columns="impl", values=metrics, aggfunc=aggregate)
    wide.columns = [f"{metric}_{impl}" for metric, impl in wide.columns]
    for metric in metrics:
        for impl in IMPLS:
            if f"{metric}_{impl}" not in wide.columns:
                wide[f"{metric}_{impl}"] = np.nan
    paired = ok[ok["impl"] == "distbench"].groupby(keys)["busbw_vs_torch"].median()
    wide["ratio"] = paired.reindex(wide.index)
    return wide.reset_index()


def _count(value: float) -> str:
    return "—" if not np.isfinite(value) else str(int(value))


def _collective_table(wide: pd.DataFrame, collective: str) -> str:
    rows = wide[wide["collective"] == collective].sort_values(["world_size", "message_bytes"])
    gbps = lambda v: f"{v:.3g}"  # noqa: E731
    table = pd.DataFrame(
        {
            "N": rows["world_size"].astype(int),
            "size S": rows["message_bytes"].map(format_bytes),
            "time distbench": rows["time_s_distbench"].map(format_seconds),
            "time torch": rows["time_s_torch"].map(format_seconds),
            "algbw distbench (GB/s)": rows["algbw_gbps_distbench"].map(gbps),
            "algbw torch (GB/s)": rows["algbw_gbps_torch"].map(gbps),
            "busbw distbench (GB/s)": rows["busbw_gbps_distbench"].map(gbps),
            "busbw torch (GB/s)": rows["busbw_gbps_torch"].map(gbps),
            "#wrong distbench": rows["wrong_distbench"].map(_count),
            "#wrong torch": rows["wrong_torch"].map(_count),
            "busbw distbench/torch": rows["ratio"].map(format_ratio),
        }
    )
    return markdown_table(table.replace("nan", "—"))


def bus_factors(ctx: Context) -> str | None:
    """Bus factors

    busbw = algbw × factor, so that a collective running at a link's full speed reads as
    that link's bandwidth whatever n is (nccl-tests' convention, doc/PERFORMANCE.md)."""
    return prose(__package__, "bus_factors", collectives=_collectives(ctx.df)) or None


def results(ctx: Context) -> str | None:
    """Results

    Measured: time is the median over repeats of the slowest rank; algbw = S / time and
    busbw = algbw × bus factor. The ratio distbench/torch is paired: inside each distbench
    cell, torch's collective is timed on the same buffers in windows alternating with
    distbench's, so machine drift affects both alike. Beside each collective's median ratio
    at its largest size stands its worst cell."""
    if ctx.ok.empty:
        return None
    wide = _wide(ctx.ok)
    rated = wide.dropna(subset=["ratio"])
    summary = []
    for collective, rows in rated.groupby("collective", sort=False):
        largest = rows[rows["message_bytes"] == rows["message_bytes"].max()]
        median = float(largest["ratio"].median())
        worst = largest.loc[largest["ratio"].idxmin()]
        size, n = format_bytes(worst["message_bytes"]), int(worst["world_size"])
        ratio, worst_ratio = format_ratio(median), format_ratio(worst["ratio"])
        summary.append((collective, ratio, worst_ratio, n))
        figure = f"{collective} busbw distbench ÷ torch, S = {size}: median over N (worst N)"
        ctx.figure(figure, source=SAME_RUN, measured=f"{ratio} (worst {worst_ratio}, N={n})")
    if not rated.empty:
        low = rated.loc[rated["ratio"].idxmin()]
        cell = {k: low[k] for k in ("collective", "world_size", "message_bytes")}
        ctx.headline.update(min_ratio=float(low["ratio"]), min_ratio_cell=cell)
        where = f"{cell['collective']}, N={int(cell['world_size'])}"
        figure = f"lowest busbw ratio, any cell ({where}, {format_bytes(cell['message_bytes'])})"
        ctx.figure(figure, source=SAME_RUN, measured=format_ratio(low["ratio"]))
    tables = [f"### `{c}`\n\n{_collective_table(wide, c)}" for c in _collectives(ctx.ok)]
    return "\n\n".join([prose(__package__, "largest", ratios=summary), *tables])


def plot(ctx: Context) -> str | None:
    """Plot"""
    ok = ctx.ok.dropna(subset=["busbw_gbps"])
    if ok.empty:
        return None
    order = _collectives(ok)
    columns = min(4, len(order))
    grid_rows = math.ceil(len(order) / columns)
    data = ok.assign(N=ok["world_size"].map(lambda n: f"N={int(n)}"))
    hue_order = [f"N={n}" for n in sorted(ok["world_size"].unique())]
    sizes = sorted(ok["message_bytes"].unique())
    ticks = sizes[:: max(1, len(sizes) // 4)]
    look = {"x": "message_bytes", "y": "busbw_gbps", "hue": "N", "hue_order": hue_order}
    look |= {"style": "impl", "style_order": list(IMPLS), "markers": True}
    fig, axes = new_figure(4.2 * columns + 1.5, 3.6 * grid_rows, grid_rows, columns, sharex=True)
    for i, ax in enumerate(axes):
        if i >= len(order):
            ax.set_visible(False)
            continue
        last = i == len(order) - 1
        sns.lineplot(data=data[data["collective"] == order[i]], ax=ax, legend=last, **look)
        log2_axis(ax, ticks, as_bytes=True)
        ax.set(title=order[i], xlabel="size S", ylabel="busbw (GB/s)")
        if last:
            sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("Bus bandwidth vs size per collective: distbench (solid) vs torch (dashed)")
    return ctx.plot(fig, "busbw_by_collective", "busbw by collective")


REPORT = Report(
    title="Collectives: distbench against torch.distributed, nccl-tests style",
    intro=prose(__package__, "intro"),
    sections=(bus_factors, results, plot),
    correctness=prose(__package__, "correctness"),
)
