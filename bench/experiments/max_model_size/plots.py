"""The `max_model_size` report's figures: the largest model vs N per stage, and the given
model's per-device memory vs N (both the cost model's, labelled so)."""

from __future__ import annotations

import math
from collections.abc import Mapping

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure

from bench.report import log2_axis, new_figure

__all__ = ["STAGE_NAMES", "max_params_figure", "per_device_figure"]

STAGE_NAMES = {0: "DP (stage 0)", 1: "ZeRO-1", 2: "ZeRO-2", 3: "ZeRO-3"}
LECTURE_LABEL = "lecture, 80 GB, N = 64"
MAX_LABEL = "largest trainable model (billions of parameters)"
STAGES = {"x": "dp", "hue": "stage_name", "hue_order": list(STAGE_NAMES.values()), "marker": "o"}


def _ticks(rows: pd.DataFrame) -> list[int]:
    """At most ~6 of the grid's N values as x ticks."""
    ns = sorted(int(n) for n in rows["dp"].unique())
    return ns[:: max(1, math.ceil(len(ns) / 6))]


def max_params_figure(rows: pd.DataFrame, lecture: Mapping[int, float]) -> Figure:
    """One line per stage (and memory); `lecture` (stage -> billions) as crosses at N = 64."""
    data = rows.assign(
        stage_name=rows["stage"].map(STAGE_NAMES),
        memory=rows["gpu_memory_gb"].map(lambda m: f"{m:g} GB"),
        billions=rows["max_params"] / 1e9,
    )
    fig, (ax,) = new_figure(7.5, 5.0)
    several = data["memory"].nunique() > 1
    sns.lineplot(data=data, y="billions", style="memory" if several else None, ax=ax, **STAGES)
    if lecture:
        cross = {"marker": "x", "s": 80, "color": "black", "zorder": 5}
        ax.scatter([64] * len(lecture), list(lecture.values()), label=LECTURE_LABEL, **cross)
    ax.set(yscale="log", xlabel="data-parallel ranks N", ylabel=MAX_LABEL)
    ax.set_title("Largest model whose model states fit, per stage (cost model)")
    log2_axis(ax, _ticks(rows))
    ax.legend(loc="upper left", fontsize="small")
    return fig


def per_device_figure(rows: pd.DataFrame, psi: float) -> Figure:
    """Model states per device of a Ψ-parameter model vs N, per stage; device sizes dashed."""
    data = rows.assign(stage_name=rows["stage"].map(STAGE_NAMES))
    fig, (ax,) = new_figure(7.5, 5.0)
    sns.lineplot(data=data, y="per_device_gb", ax=ax, **STAGES)
    below = {"xytext": (0, -11), "textcoords": "offset points", "ha": "right"}
    for memory in sorted(rows["gpu_memory_gb"].unique()):
        ax.axhline(memory, color="grey", linestyle="--", linewidth=1)
        at = (rows["dp"].max(), memory)
        ax.annotate(f"{memory:g} GB device", at, fontsize="small", **below)
    ax.set(yscale="log", xlabel="data-parallel ranks N", ylabel="model states per device (GB)")
    ax.set_title(f"Per-device memory of a {psi / 1e9:g}B-parameter model (cost model)")
    log2_axis(ax, _ticks(rows))
    ax.legend(loc="lower left", fontsize="small")
    return fig
