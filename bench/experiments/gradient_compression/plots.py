"""The `gradient_compression` report's plots: training curves (loss per step, held-out
accuracy per evaluation) and accuracy against counted bytes with its Pareto frontier."""

from __future__ import annotations

import json
import math
from collections.abc import Callable
from typing import Any

import numpy as np
import pandas as pd
from matplotlib.ticker import FuncFormatter, LogLocator

from bench.report import format_bytes, new_figure

__all__ = ["curves_figure", "pareto", "pareto_figure"]

KEYS = ["method", "setting"]


def _json(value: Any) -> list:
    return json.loads(value) if isinstance(value, str) else (value or [])


def _curves(ok: pd.DataFrame) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """(method, setting) -> (mean train loss per step, [[step, acc]]) over seeds."""
    out = {}
    for (method, setting), rows in ok.groupby(KEYS, sort=False):
        losses = [_json(c) for c in rows["loss_curve"]]
        evals = [_json(c) for c in rows["eval_curve"]]
        n, m = min(len(v) for v in losses), min(len(v) for v in evals)
        if not n or not m:
            continue
        loss = np.mean([v[:n] for v in losses], axis=0)
        acc = np.mean([[e[3] for e in v[:m]] for v in evals], axis=0)
        steps = np.array([e[0] for e in evals[0][:m]])
        out[(method, str(setting))] = (loss, np.stack([steps, acc]))
    return out


def _smooth(values: np.ndarray, window: int) -> np.ndarray:
    if len(values) < window or window < 2:
        return values
    kernel = np.ones(window) / window
    return np.convolve(values, kernel, mode="valid")


def curves_figure(ok: pd.DataFrame, label: Callable[[str, str], str]) -> Any | None:
    """Training loss and held-out accuracy of every (method, setting), means over seeds;
    None when no row has a curve."""
    curves = _curves(ok)
    if not curves:
        return None
    fig, (loss_ax, acc_ax) = new_figure(13, 4.8, 1, 2)
    window = max(1, max(len(loss) for loss, _ in curves.values()) // 30)
    for i, ((method, setting), (loss, evals)) in enumerate(curves.items()):
        style = "--" if method.startswith("torch_") or method == "topk_noef" else "-"
        style = ("-", "-.", ":")[(i // 10) % 3] if style == "-" else style  # > 10 lines: new dash
        smooth, line = _smooth(loss, window), {"color": f"C{i % 10}", "linewidth": 1.2}
        steps = np.arange(len(smooth)) + window
        loss_ax.plot(steps, smooth, style, label=label(method, setting), **line)
        acc_ax.plot(evals[0], 100 * evals[1], style, marker=".", **line)
    positive = all(np.nanmin(loss) > 0 for loss, _ in curves.values())
    ylabel = f"train loss (mean of ranks, {window}-step avg)"
    scale = "log" if positive else "linear"
    loss_ax.set(yscale=scale, xlabel="step", ylabel=ylabel, title="Training loss")
    acc_ax.set(xlabel="step", ylabel="held-out accuracy (%)", title="Held-out accuracy")
    finals = pd.to_numeric(ok["final_accuracy"], errors="coerce")
    low = 100 * float(finals.min()) - 5 if finals.notna().any() else 0.0
    acc_ax.set_ylim(max(0.0, low), 100)
    handles = loss_ax.get_legend_handles_labels()
    fig.legend(*handles, loc="upper center", bbox_to_anchor=(0.5, 0.0), ncol=4, fontsize="small")
    return fig


def pareto(points: pd.DataFrame) -> pd.DataFrame:
    """The rows no other row beats on both fewer bytes and higher accuracy."""
    pts = points.sort_values(["bytes_per_step", "final_accuracy"], ascending=[True, False])
    best, keep = -math.inf, []
    for idx, acc in zip(pts.index, pts["final_accuracy"], strict=True):
        if acc > best:
            keep.append(idx)
            best = acc
    return pts.loc[keep]


def pareto_figure(pts: pd.DataFrame, frontier: pd.DataFrame, label: Callable) -> Any:
    """Accuracy against counted bytes per step (log 2), one marker per setting."""
    fig, (ax,) = new_figure(8.5, 5.5)
    for i, row in enumerate(pts.itertuples()):
        # 10 colours × 7 markers: no two of up to 70 settings look alike
        style = {"color": f"C{i % 10}", "marker": "osD^v<>"[i % 7], "zorder": 5}
        label_ = label(row.method, row.setting)
        ax.scatter(row.bytes_per_step, 100 * row.final_accuracy, s=55, label=label_, **style)
    x, y = frontier["bytes_per_step"], 100 * frontier["final_accuracy"]
    ax.step(x, y, where="post", color="grey", alpha=0.6, label="Pareto frontier")
    ax.set_xscale("log", base=2)
    ax.xaxis.set_major_locator(LogLocator(base=2))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: format_bytes(v)))
    ax.set(
        xlabel="bytes on the wire per step (busiest rank, counted)",
        ylabel="final held-out accuracy (%)",
        title="Accuracy against bytes on the wire (up and left is better)",
    )
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    return fig
