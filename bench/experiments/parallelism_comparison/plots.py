"""The `parallelism_comparison` plots, one panel per world size and one bar per layout:
memory per rank (stacked by part), bytes sent per step (stacked by axis) and where the
replayed step's rank-time goes (compute, communication, waiting)."""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.lines import Line2D
from matplotlib.patches import Patch
from matplotlib.ticker import FuncFormatter, MultipleLocator

from bench.report import Context, format_bytes, new_figure

__all__ = [
    "AXIS_COLOURS",
    "ORDER",
    "PARTS",
    "ordered",
    "plot_comm",
    "plot_memory",
    "plot_utilization",
]

ORDER = ("DP", "TP", "PP", "2D", "3D")  # the lecture's rows, then the compositions
PARTS = {
    "param_bytes": "weights",
    "grad_bytes": "gradients",
    "optim_bytes": "AdamW moments",
    "activation_peak_bytes": "saved activations (peak)",
}
PART_COLOURS = ("#4C72B0", "#DD8452", "#55A868", "#8172B3")
AXIS_COLOURS = {"dp": "#4C72B0", "pp": "#55A868", "tp": "#C44E52"}
TIME_PARTS = (
    ("compute", "#55A868", "compute (replayed)"),
    ("comm", "#C44E52", "communication rounds (replayed)"),
    ("wait", "#BBBBBB", "waiting: bubbles, transfers (replayed)"),
)


def ordered(rows: pd.DataFrame) -> pd.DataFrame:
    """`rows` by world size, then the lecture's order of strategies, then layout."""
    rank = rows["strategy"].map(lambda s: ORDER.index(s) if s in ORDER else len(ORDER))
    return rows.assign(_order=rank).sort_values(["world_size", "_order", "layout"])


def _panels(ok: pd.DataFrame) -> tuple[Any, list[tuple[Any, pd.DataFrame]]]:
    """One figure, and for each world size its axis and its rows in order."""
    sizes = sorted(int(n) for n in ok["world_size"].unique())
    fig, axes = new_figure(4.2 * len(sizes) + 1.5, 4.2, 1, len(sizes))
    for ax, n in zip(axes, sizes, strict=True):
        ax.set_title(f"N = {n} ranks")
    return fig, [
        (ax, ordered(ok[ok["world_size"] == n])) for ax, n in zip(axes, sizes, strict=True)
    ]


def _bars(ax: Any, rows: pd.DataFrame, parts: list[tuple[str, str]]) -> np.ndarray:
    """Stacked bars of `rows`' columns `parts` = [(column, colour)], one per layout
    (missing values drawn as 0); returns their x positions."""
    x = np.arange(len(rows))
    bottom = np.zeros(len(rows))
    for column, colour in parts:
        values = np.nan_to_num(rows[column].to_numpy(dtype=float))
        ax.bar(x, values, bottom=bottom, color=colour, width=0.7)
        bottom += values
    ax.set_xticks(x, rows["layout"], rotation=35, ha="right", fontsize=9)
    return x


def _bytes_axis(ax: Any, rows: pd.DataFrame, columns: list[str], marker: str) -> None:
    """Ticks at multiples of a power of two (8 MiB, 16 MiB, …), about five of them, up to
    the tallest stack of `columns` or `marker` value."""
    stacks = np.nan_to_num(rows[columns].to_numpy(dtype=float)).sum(axis=1)
    top = max(float(stacks.max()), float(np.nan_to_num(rows[marker].to_numpy(dtype=float)).max()))
    step = 2 ** max(0, math.floor(math.log2(top / 4))) if top > 0 else 1
    ax.yaxis.set_major_locator(MultipleLocator(step))
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))


def _save(ctx: Context, fig: Any, handles: list, title: str, name: str, alt: str) -> str:
    fig.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.08), ncol=3)
    fig.suptitle(title)
    return ctx.plot(fig, name, alt)


def _marker(label: str, marker: str = "D", **style: Any) -> Line2D:
    return Line2D([], [], marker=marker, color="black", linestyle="", label=label, **style)


def plot_memory(ctx: Context, ok: pd.DataFrame) -> str:
    """memory_per_rank.png: the fullest rank's parts, the theory 16Ψ/k beside them."""
    parts = list(zip(PARTS, PART_COLOURS, strict=True))
    fig, panels = _panels(ok)
    for ax, rows in panels:
        x = _bars(ax, rows, parts)
        ax.scatter(x, rows["theory_model_state_bytes"], marker="D", color="black", zorder=5)
        _bytes_axis(ax, rows, list(PARTS), "theory_model_state_bytes")
    handles = [
        Patch(color=c, label=label) for label, c in zip(PARTS.values(), PART_COLOURS, strict=True)
    ]
    handles.append(_marker("theory: 16Ψ/k model states (mean per rank)"))
    title = "Memory per rank (the fullest rank), measured"
    return _save(ctx, fig, handles, title, "memory_per_rank", "memory per rank")


def plot_comm(ctx: Context, ok: pd.DataFrame) -> str:
    """comm_per_step.png: bytes sent per step by axis, the papers' counts beside them."""
    parts = [(f"comm_bytes_{axis}", colour) for axis, colour in AXIS_COLOURS.items()]
    fig, panels = _panels(ok)
    for ax, rows in panels:
        x = _bars(ax, rows, parts)
        ax.scatter(x, rows["predicted_comm_bytes_per_step"], marker="D", color="black", zorder=5)
        _bytes_axis(ax, rows, [column for column, _ in parts], "predicted_comm_bytes_per_step")
    handles = [Patch(color=c, label=f"{axis} axis") for axis, c in AXIS_COLOURS.items()]
    handles.append(_marker("predicted (papers' counts)"))
    title = "Bytes sent per step by the busiest rank of each axis, counted"
    return _save(ctx, fig, handles, title, "comm_per_step", "communication per step")


def plot_utilization(ctx: Context, ok: pd.DataFrame) -> str:
    """utilization.png: the replayed step split into compute, communication and waiting;
    the wall-clock utilization and the bubble bound as markers."""
    fig, panels = _panels(ok)
    for ax, rows in panels:
        shares = rows.assign(
            compute=rows["util_replayed"],
            comm=rows["comm_fraction_replayed"],
            wait=1 - rows["util_replayed"] - rows["comm_fraction_replayed"],
        )
        x = _bars(ax, shares, [(column, colour) for column, colour, _ in TIME_PARTS])
        ax.scatter(x, rows["util_wall"], marker="o", color="black", zorder=5)
        ax.scatter(x, rows["util_theory"], marker="_", s=400, color="black", zorder=5)
        ax.set_ylim(0, 1.05)
        ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{100 * v:.0f}%"))
    handles = [Patch(color=colour, label=label) for _, colour, label in TIME_PARTS]
    handles += [
        _marker("utilization, wall clock", "o"),
        _marker("bubble bound M/(M+pp−1)", "_", markersize=14),
    ]
    title = "Where the step's rank-time goes, replayed as if every rank had its own device"
    return _save(ctx, fig, handles, title, "utilization", "utilization")
