"""The `tensor_parallel` report's plots: traffic per block, memory per rank, step time.

Each takes the report's context and the rows that ran, saves its PNG beside the report
and returns the markdown that shows it.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from bench.report import Context, format_bytes, new_figure

__all__ = ["MEGATRON_ALLREDUCES", "METHODS", "methods", "plot_comm", "plot_memory", "plot_time"]

METHODS = {"distbench": "distbench (Megatron layers)", "torch_dtensor": "torch DTensor"}
COLOURS = {"distbench": "#4C72B0", "torch_dtensor": "#DD8452"}
MEGATRON_ALLREDUCES = (2, 2)  # per transformer block: forward, backward


def methods(df: pd.DataFrame) -> list[str]:
    """The methods present, in the report's order."""
    present = {str(m) for m in pd.unique(df["method"])}
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def _bytes_panel(ax, ours: pd.DataFrame) -> None:
    """distbench's bytes per block vs t: measured bars, the formula's markers."""
    x = np.arange(len(ours))
    ax.bar(
        x - 0.2, ours["comm_bytes_per_layer_fwd"], 0.4, label="forward (measured)", color="#4C72B0"
    )
    ax.bar(
        x + 0.2, ours["comm_bytes_per_layer_bwd"], 0.4, label="backward (measured)", color="#55A868"
    )
    for offset, column in (
        (-0.2, "predicted_comm_bytes_per_layer_fwd"),
        (0.2, "predicted_comm_bytes_per_layer_bwd"),
    ):
        ax.scatter(x + offset, ours[column], marker="D", color="black", zorder=5, s=24)
    ax.scatter([], [], marker="D", color="black", label="Megatron count, ring")
    ax.set_xticks(x, [f"t = {int(t)}" for t in ours["tp"]])
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.legend(fontsize=8)


def plot_comm(ctx: Context, ok: pd.DataFrame) -> str:
    """Left: distbench's bytes per block vs t. Right: all-reduces per block, forward and
    backward, per method and t."""
    fig, axes = new_figure(11, 4, 1, 2)
    ours = ok[(ok["method"] == "distbench") & (ok["tp"] > 1)].sort_values("tp")
    if len(ours):
        _bytes_panel(axes[0], ours)
    axes[0].set_title("distbench: bytes sent per rank per block")
    ax = axes[1]
    parallel = ok[ok["tp"] > 1].sort_values(["tp", "method"])
    labels = [
        f"{METHODS.get(m, m).split(' (')[0]}\nt = {int(t)}"
        for m, t in zip(parallel["method"], parallel["tp"], strict=True)
    ]
    x = np.arange(len(parallel))
    colours = [COLOURS.get(m, "grey") for m in parallel["method"]]
    ax.bar(x, parallel["allreduces_per_layer_fwd"], 0.6, color=colours, label="forward")
    ax.bar(
        x,
        parallel["allreduces_per_layer_bwd"],
        0.6,
        bottom=parallel["allreduces_per_layer_fwd"],
        color=colours,
        alpha=0.5,
        hatch="//",
        label="backward",
    )
    ax.axhline(sum(MEGATRON_ALLREDUCES), color="black", linestyle="--", label="Megatron: 2 + 2")
    ax.set_xticks(x, labels, fontsize=8)
    ax.set_ylabel("all-reduces per block")
    ax.set_title("collectives per block (solid: forward, hatched: backward)")
    ax.legend(fontsize=8)
    return ctx.plot(fig, "comm_per_layer", "communication per layer")


def plot_memory(ctx: Context, ok: pd.DataFrame) -> str:
    fig, (ax,) = new_figure(6, 4, 1, 1)
    for i, method in enumerate(methods(ok)):
        rows = ok[ok["method"] == method].sort_values("tp")
        colour = COLOURS.get(method, "grey")
        label = METHODS.get(method, method)
        # Hollow, larger markers for the first method: where both hold the same bytes,
        # both stay visible.
        style = {
            "markersize": 11 - 4 * min(i, 1),
            "color": colour,
            "markerfacecolor": "none" if i == 0 else colour,
        }
        ax.plot(rows["tp"], rows["peak_bytes"], marker="o", label=f"{label}: peak", **style)
        ax.plot(
            rows["tp"],
            rows["param_bytes"],
            marker="s",
            linestyle=":",
            label=f"{label}: parameters",
            **style,
        )
    ax.set_xscale("log", base=2)
    ts = sorted(int(t) for t in ok["tp"].unique())
    ax.set_xticks(ts, [str(t) for t in ts])
    ax.set_xlabel("tensor-parallel degree t")
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.set_title("per-rank memory over a forward + backward of the blocks")
    ax.legend(fontsize=7)
    return ctx.plot(fig, "memory_per_rank", "memory per rank")


def plot_time(ctx: Context, ok: pd.DataFrame) -> str:
    fig, (ax,) = new_figure(6, 4, 1, 1)
    ts = sorted(int(t) for t in ok["tp"].unique())
    shown = methods(ok)
    width = 0.8 / max(len(shown), 1)
    for i, method in enumerate(shown):
        rows = ok[ok["method"] == method].set_index("tp")
        values = [float(rows["step_time_s"].get(t, math.nan)) * 1e3 for t in ts]
        ax.bar(
            np.arange(len(ts)) + (i - (len(shown) - 1) / 2) * width,
            values,
            width,
            color=COLOURS.get(method, "grey"),
            label=METHODS.get(method, method),
        )
    ax.set_xticks(np.arange(len(ts)), [f"t = {t}" for t in ts])
    ax.set_ylabel("step time (ms), blocks forward + backward")
    ax.set_title("step time per TP degree (same run)")
    ax.legend(fontsize=8)
    return ctx.plot(fig, "step_time", "step time")
