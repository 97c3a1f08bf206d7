"""The `sequence_parallel` report's plots: a measured column beside its formula(s) per P,
and the Ulysses ÷ Megatron-SP ratio against 1/P.

Each takes the report's context and the rows to draw, saves its PNG beside the report
and returns the markdown that shows it.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter

from bench.report import Context, format_bytes, log2_axis, new_figure

__all__ = ["METHODS", "methods", "name", "plot_by_degree", "plot_ratio"]

METHODS = {"megatron_sp": "Megatron-SP", "ulysses": "Ulysses", "ring_attention": "Ring Attention"}
COLOURS = {"megatron_sp": "#4C72B0", "ulysses": "#DD8452", "ring_attention": "#55A868"}
# Marker and size per method: where two methods' values coincide (Megatron-SP and Ulysses
# at P = 1; Megatron-SP and Ring Attention per link at P = 2) the smaller one stays visible.
MARKERS = {"megatron_sp": ("o", 70), "ulysses": ("s", 40), "ring_attention": ("D", 18)}


def name(method: str) -> str:
    return METHODS.get(method, method)


def methods(df: pd.DataFrame) -> list[str]:
    """The methods present, in the report's order."""
    present = {str(m) for m in pd.unique(df["method"])}
    return [m for m in METHODS if m in present] + sorted(present - set(METHODS))


def _bytes_axis(ax: Any, values: pd.Series) -> None:
    """A log-2 bytes axis, where there is anything positive to put on one."""
    if (pd.to_numeric(values, errors="coerce") > 0).any():
        ax.set_yscale("log", base=2)
    ax.yaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))


def _panel(ax: Any, panel: pd.DataFrame, lines: dict[str, str], measured: str) -> None:
    for method in methods(panel):
        rows, colour = panel[panel["method"] == method], COLOURS.get(method)
        for (column, label), style in zip(lines.items(), ("-", "--"), strict=False):
            ax.plot(
                rows["seq_len"],
                rows[column],
                linestyle=style,
                color=colour,
                alpha=0.8,
                label=f"{name(method)}, {label}",
            )
        marker, size = MARKERS.get(method, ("^", 30))
        ax.scatter(
            rows["seq_len"],
            rows[measured],
            color=colour,
            zorder=5,
            s=size,
            marker=marker,
            label=f"{name(method)}, measured",
        )


def plot_by_degree(
    ctx: Context, rows: pd.DataFrame, file: str, lines: dict[str, str], measured: str, title: str
) -> str:
    """One panel per P: each method's formula(s) as lines, its measurements as markers."""
    degrees = sorted(int(p) for p in rows["sp"].unique())
    fig, axes = new_figure(4.2 * len(degrees) + 1, 4.2, 1, len(degrees), sharey=True)
    lens = sorted(int(s) for s in rows["seq_len"].unique())
    for ax, sp in zip(axes, degrees, strict=True):
        _panel(ax, rows[rows["sp"] == sp].sort_values("seq_len"), lines, measured)
        log2_axis(ax, lens)
        ax.set_xlim(min(lens) / 1.25, max(lens) * 1.25)  # set even when no value is finite
        _bytes_axis(ax, rows[[measured, *lines]].stack())
        ax.set(title=f"P = {sp}", xlabel="sequence length s")
    axes[0].set_ylabel(title)
    handles, labels = axes[0].get_legend_handles_labels()
    fig.legend(
        handles, labels, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=3, fontsize="small"
    )
    return ctx.plot(fig, file, title)


def plot_ratio(ctx: Context, ulysses: pd.DataFrame) -> str:
    """Ulysses ÷ Megatron-SP bytes per link against P, counted, beside 1/P."""
    fig, (ax,) = new_figure(6.0, 4.2)
    degrees = sorted(int(p) for p in ulysses["sp"].unique())
    grid = np.linspace(min(degrees), max(degrees), 100)
    ax.plot(grid, 1 / grid, color="grey", label="formula 1/P (Jacobs et al. 2023 §3.2)")
    for i, (seq_len, rows) in enumerate(ulysses.groupby("seq_len")):
        # Every s gives the same ratio: hollow markers shrinking with s keep each visible.
        ax.scatter(
            rows["sp"],
            rows["measured"],
            marker="osD^v<>"[i % 7],
            s=90 - 12 * (i % 6),
            facecolors="none",
            edgecolors=f"C{i % 10}",
            linewidths=1.5,
            zorder=5,
            label=f"counted, s = {int(seq_len)}",
        )
    log2_axis(ax, degrees)
    ax.set(
        xlabel="sequence-parallel degree P",
        ylabel="Ulysses ÷ Megatron-SP bytes per link",
        title="Per-link volume, Ulysses relative to Megatron-SP",
    )
    ax.legend(fontsize="small")
    return ctx.plot(fig, "ulysses_vs_megatron", "Ulysses / Megatron-SP")
