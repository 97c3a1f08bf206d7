"""The `zero_memory` report's two figures: model states per rank as the ZeRO paper's
Figure 1 draws them, and the counted traffic in units of Ψ beside 2Ψ / 3Ψ·(N−1)/N."""

from __future__ import annotations

import numpy as np
import pandas as pd
from matplotlib.figure import Figure
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter

from bench.report import format_bytes, log2_axis, new_figure

__all__ = ["METHODS", "PARTS", "cell_columns", "comm_figure", "memory_figure", "methods_in"]

METHODS = {
    "dp": "DP",
    "ddp": "DDP (buckets, overlapped)",
    "ddp_no_overlap": "DDP (buckets, no overlap)",
    "zero1": "ZeRO-1",
    "zero2": "ZeRO-2",
    "zero3": "ZeRO-3",
    "torch_ddp": "torch DDP",
    "torch_zero_redundancy": "torch ZeroRedundancyOptimizer",
    "torch_fsdp2": "torch FSDP2",
}
# Tick labels of the memory figure (torch's names shortened so that they fit a bar).
SHORT = {**METHODS, "torch_zero_redundancy": "torch ZeRO-1"}
PARTS = {"param_bytes": "weights", "grad_bytes": "gradients", "optim_bytes": "optimizer"}
PART_COLOURS = {"param_bytes": "#4C72B0", "grad_bytes": "#DD8452", "optim_bytes": "#55A868"}


def methods_in(df: pd.DataFrame) -> list[str]:
    """The methods of `df`, in the report's order."""
    present = {str(m) for m in pd.unique(df["method"])}
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def cell_columns(rows: pd.DataFrame) -> dict[str, pd.Series]:
    """The columns that name each row's cell in a table: method, N, precision."""
    return {
        "method": rows["method"].map(lambda m: METHODS.get(m, m)),
        "N": rows["world_size"].astype(int),
        "precision": rows["precision"],
    }


def memory_figure(rows: pd.DataFrame) -> Figure:
    """Stacked weights / gradients / optimizer per method, one panel per (precision, N),
    the cost model's total as a marker. `rows` have every part measured."""
    precisions = list(pd.unique(rows["precision"]))
    ns = sorted(int(n) for n in rows["world_size"].unique())
    fig, axes = new_figure(
        3.2 * len(ns) + 1.5, 3.8 * len(precisions), len(precisions), len(ns), sharey="row"
    )
    for i, precision in enumerate(precisions):
        for j, n in enumerate(ns):
            ax = axes[i * len(ns) + j]
            cell = rows[(rows["precision"] == precision) & (rows["world_size"] == n)]
            methods = methods_in(cell) if len(cell) else []
            by_method = cell.drop_duplicates("method").set_index("method")
            x = np.arange(len(methods))
            bottom = np.zeros(len(methods))
            for part, colour in PART_COLOURS.items():
                values = by_method.loc[methods, part].to_numpy(float)
                ax.bar(x, values, bottom=bottom, color=colour, width=0.7)
                bottom += values
            predicted = by_method.loc[methods, "predicted_model_state_bytes"].to_numpy(float)
            ax.scatter(x, predicted, marker="D", color="black", zorder=5, s=24)
            ax.set_xticks(
                x, [SHORT.get(m, m) for m in methods], rotation=40, ha="right", fontsize=8
            )
            ax.set_title(f"{precision}, N = {n}")
            ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    handles = [Patch(color=c, label=PARTS[p]) for p, c in PART_COLOURS.items()]
    handles.append(
        Line2D(
            [], [], marker="D", color="black", linestyle="", label="predicted total (cost model)"
        )
    )
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4)
    fig.suptitle("Model states per rank, measured (bars) vs cost model (◆), as ZeRO Fig. 1")
    fig.subplots_adjust(hspace=0.55)
    return fig


def comm_figure(rows: pd.DataFrame) -> Figure:
    """Counted bytes per rank per step in units of Ψ, per method, beside the theory."""
    fig, (ax,) = new_figure(6.5, 4.2)
    ns = sorted(int(n) for n in rows["world_size"].unique())
    grid = np.linspace(min(ns), max(ns), 100)
    for multiple, style in ((2, "--"), (3, ":")):
        ax.plot(
            grid,
            multiple * (grid - 1) / grid,
            color="grey",
            linestyle=style,
            label=f"theory {multiple}Ψ·(N−1)/N",
        )
    # Stages 0–2 coincide when they meet the theory: shrinking markers keep each visible.
    for i, (method, group) in enumerate(rows.groupby("method", sort=False)):
        ax.plot(
            group["world_size"],
            group["comm_psi_multiple"],
            marker="osD^v"[i % 5],
            markersize=9 - 1.5 * (i % 4),
            label=f"{METHODS.get(method, method)} (counted)",
        )
    log2_axis(ax, ns)
    ax.set(
        xlabel="ranks N",
        ylabel="bytes sent per rank per step / (Ψ · bytes per element)",
        title="Traffic per rank per step, in units of Ψ",
    )
    ax.legend(fontsize="small")
    return fig
