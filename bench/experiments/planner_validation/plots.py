"""The `planner_validation` report's figures: predicted against measured step time and
peak memory per rank, one point per ground-truth configuration, log axes, y = x drawn."""

from __future__ import annotations

import math

import pandas as pd
from matplotlib.figure import Figure

from bench.report import new_figure

__all__ = ["scatter_figure"]

MARKERS = {"parallelism_comparison": "o", "zero_memory": "s", "pipeline_utilization": "^"}


def scatter_figure(
    rows: pd.DataFrame, measured: str, predicted: str, what: str, band: float
) -> Figure:
    """Predicted vs measured `what`, coloured by source; the ±`band` corridor shaded."""
    fig, axes = new_figure(5.5, 5.0)
    ax = axes[0]
    values = pd.concat([rows[measured], rows[predicted]]).astype(float)
    values = values[values.map(lambda v: math.isfinite(v) and v > 0)]
    low, high = (values.min() / 1.5, values.max() * 1.5) if len(values) else (1e-3, 1.0)
    for source, sub in rows.groupby("source"):
        ax.scatter(
            sub[measured],
            sub[predicted],
            label=source,
            alpha=0.75,
            marker=MARKERS.get(str(source), "o"),
        )
    ax.plot([low, high], [low, high], color="black", linewidth=1, label="predicted = measured")
    ax.fill_between(
        [low, high],
        [low * (1 - band), high * (1 - band)],
        [low * (1 + band), high * (1 + band)],
        color="grey",
        alpha=0.2,
        label=f"±{band:.0%}",
    )
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlim(low, high)
    ax.set_ylim(low, high)
    ax.set_xlabel(f"measured {what}")
    ax.set_ylabel(f"predicted {what} (simulator)")
    ax.set_title(f"{what}: simulator vs runs here")
    ax.legend(fontsize=8)
    return fig
