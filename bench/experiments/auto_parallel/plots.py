"""The `auto_parallel` report's plots: step-time breakdown, MFU against GPU count, memory
against plan. Every value drawn is the simulator's prediction."""

from __future__ import annotations

from typing import Any

import pandas as pd

from bench.report import log2_axis, new_figure

__all__ = ["BREAKDOWN", "breakdown_figure", "memory_figure", "mfu_figure", "plan_label"]

BREAKDOWN = (
    ("compute_s", "compute"),
    ("bubble_s", "pipeline bubble"),
    ("exposed_tp_s", "exposed TP comm"),
    ("exposed_pp_s", "exposed PP comm"),
    ("exposed_dp_s", "exposed DP comm"),
    ("optimizer_s", "optimizer"),
)


def plan_label(row: Any) -> str:
    sp = "" if row["sp"] == "none" else f" {row['sp']}"
    cp = int(row.get("cp", 1) or 1)
    sp = f" cp{cp}{sp}" if cp > 1 else sp
    v = f" V{int(row['virtual_stages'])}" if row["virtual_stages"] > 1 else ""
    dp, tp, pp, zero, b = (int(row[k]) for k in ("dp", "tp", "pp", "zero_stage", "microbatch_size"))
    return f"dp{dp} tp{tp} pp{pp}{sp} Z{zero} b{b} {row['schedule']}{v} rc={row['recompute']}"


def breakdown_figure(rows: pd.DataFrame) -> Any:
    """Stacked bars of each plan's predicted step time, one panel per GPU count."""
    counts = sorted(rows["gpus"].unique())
    fig, axes = new_figure(6.5 * len(counts), 4.8, cols=len(counts))
    for ax, gpus in zip(axes, counts, strict=True):
        sub = rows[rows["gpus"] == gpus].reset_index(drop=True)
        bottom = pd.Series(0.0, index=sub.index)
        for column, label in BREAKDOWN:
            values = sub[column].fillna(0.0)
            ax.barh(sub.index, values, left=bottom, label=label)
            bottom += values
        ax.set_yticks(sub.index, [plan_label(r) for _, r in sub.iterrows()], fontsize=7)
        ax.invert_yaxis()
        ax.set_xlabel("predicted step time (s)")
        ax.set_title(f"{gpus} GPUs")
    axes[0].legend(fontsize=7, loc="lower right")
    fig.suptitle("Predicted step time by part (simulator output, not measured)")
    return fig


def mfu_figure(best: pd.DataFrame) -> Any:
    """The best plan's predicted MFU and TFLOP/s per GPU against the GPU count."""
    fig, axes = new_figure(6.5, 4.2)
    ax = axes[0]
    ax.plot(best["gpus"], 100 * best["predicted_mfu"], marker="o", label="MFU (%)")
    ax.set_ylabel("predicted MFU (%)")
    log2_axis(ax, best["gpus"])
    ax.set_xlabel("GPUs")
    ax.set_ylim(0, 100)
    for _, row in best.iterrows():
        text = f"{row['predicted_tflops_per_gpu']:.0f} TFLOP/s"
        at = (row["gpus"], 100 * row["predicted_mfu"])
        ax.annotate(text, at, textcoords="offset points", xytext=(0, 8), ha="center", fontsize=8)
    ax.set_title("Best plan per GPU count (simulator output, not measured)")
    return fig


def memory_figure(rows: pd.DataFrame, device_gb: float) -> Any:
    """Peak memory per device of every plan kept, against the device's memory."""
    fig, axes = new_figure(8.0, 0.35 * len(rows) + 1.8)
    ax = axes[0]
    labels = [f"{int(r['gpus'])} GPUs: {plan_label(r)}" for _, r in rows.iterrows()]
    colors = ["tab:blue" if fits else "tab:red" for fits in rows["fits"].astype(bool)]
    ax.barh(range(len(rows)), rows["predicted_peak_memory_gb"], color=colors)
    ax.axvline(device_gb, color="black", linestyle="--", label=f"device memory {device_gb:g} GB")
    ax.set_yticks(range(len(rows)), labels, fontsize=7)
    ax.invert_yaxis()
    ax.set_xlabel("predicted peak memory per device (GB); red: does not fit")
    ax.legend(fontsize=8)
    return fig
