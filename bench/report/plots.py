"""Plot helpers: pyplot-free figures (no global state), log-2 axes, PNGs at one DPI."""

from __future__ import annotations

import io
from collections.abc import Iterable
from pathlib import Path
from typing import Any

import numpy as np
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter

from bench.report.format import format_bytes, write_bytes_atomic

__all__ = ["PLOT_DPI", "log2_axis", "new_figure", "save_figure"]

PLOT_DPI = 120


def save_figure(fig: Any, path: Path) -> Path:
    """Save a `matplotlib.figure.Figure` (built without pyplot, so no global state) through
    a temporary file renamed over `path`, as every report file is written."""
    buffer = io.BytesIO()
    fig.savefig(
        buffer, format=Path(path).suffix.lstrip(".") or "png", dpi=PLOT_DPI, bbox_inches="tight"
    )
    write_bytes_atomic(Path(path), buffer.getvalue())
    return path


def new_figure(
    width: float, height: float = 4.5, rows: int = 1, cols: int = 1, **subplots: Any
) -> tuple[Figure, np.ndarray]:
    """A pyplot-free Figure with a flat array of whitegrid axes."""
    with sns.axes_style("whitegrid"):
        fig = Figure(figsize=(width, height))
        axes = fig.subplots(rows, cols, squeeze=False, **subplots)
    return fig, np.asarray(axes).ravel()


def log2_axis(ax: Any, ticks: Iterable[float], as_bytes: bool = False) -> None:
    """Log-2 x axis with ticks only at `ticks`, labelled as plain numbers or KiB/MiB."""
    ax.set_xscale("log", base=2)
    ax.set_xticks(list(ticks))
    label = format_bytes if as_bytes else (lambda v: f"{v:g}")
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: label(v)))
    ax.xaxis.set_minor_formatter(FuncFormatter(lambda v, _: ""))
