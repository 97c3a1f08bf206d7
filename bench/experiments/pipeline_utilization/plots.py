"""The pipeline_utilization report's figures: utilization and memory panels per P, and the
Gantt charts of measured steps. Each function returns a Figure; the sections save it
(`ctx.plot`)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pandas as pd
import seaborn as sns
from matplotlib.figure import Figure
from matplotlib.patches import Patch

from bench.experiments.pipeline_utilization.names import declared
from bench.report import format_percent, log2_axis, new_figure

__all__ = ["gantt", "memory", "utilization"]

KIND_COLOURS = {"F": "#4C72B0", "B": "#55A868", "I": "#DD8452", "W": "#8172B3"}


def _panels(
    rows: pd.DataFrame, draw: Callable[..., None], title: str, schedules: list[str], **shared: Any
) -> Figure:
    """One row of two panels per P; `draw(left, right, p, group, styles)` fills a row.

    Each schedule keeps its colour and marker in every panel, so overlapping lines stay
    distinguishable."""
    stages = sorted(int(p) for p in rows["stages"].unique())
    fig, axes = new_figure(12, 4.6 * len(stages), rows=len(stages), cols=2, **shared)
    colours = sns.color_palette("tab10", len(schedules))
    markers = declared(rows, "marker")  # each schedule's spec's, through the results
    styles = {s: (c, markers.get(s, "o")) for s, c in zip(schedules, colours, strict=True)}
    for i, p in enumerate(stages):
        group = rows[rows["stages"] == p].sort_values("microbatches")
        left, right = axes[2 * i], axes[2 * i + 1]
        draw(left, right, p, group, styles)
        ticks = sorted(int(m) for m in group["microbatches"].unique())
        for ax in (left, right):
            log2_axis(ax, ticks)
            # Limits from the grid, not the data: a panel with no finite value still draws.
            ax.set(xlabel="micro-batches M", xlim=(ticks[0] / 1.3, ticks[-1] * 1.3))
    fig.suptitle(title)
    fig.subplots_adjust(hspace=0.35)
    return fig


def utilization(rows: pd.DataFrame, schedules: list[str]) -> Figure:
    return _panels(
        rows,
        _draw_utilization,
        "Pipeline utilization vs micro-batches (measured; bounds from the papers)",
        schedules,
        sharey=True,
    )


def memory(rows: pd.DataFrame, schedules: list[str]) -> Figure:
    return _panels(
        rows, _draw_memory, "Activation memory per rank by schedule (measured)", schedules
    )


def _lines(group: pd.DataFrame, styles: dict) -> Iterator[tuple[str, Any, str, pd.DataFrame]]:
    """(schedule, colour, marker, its rows) for each schedule of `styles` in `group`."""
    for schedule, (colour, marker) in styles.items():
        line = group[group["schedule"] == schedule]
        if not line.empty:
            yield schedule, colour, marker, line


def _draw_utilization(
    replayed_ax: Any, wall_ax: Any, p: int, group: pd.DataFrame, styles: dict
) -> None:
    for schedule, colour, marker, line in _lines(group, styles):
        replayed_ax.plot(
            line["microbatches"],
            line["util_replayed"],
            marker=marker,
            ls="-",
            color=colour,
            label=f"{schedule} (replayed)",
        )
        theory = line.dropna(subset=["util_theory"])
        replayed_ax.plot(
            theory["microbatches"],
            theory["util_theory"],
            "--",
            color=colour,
            alpha=0.7,
            label=f"{schedule} bound",
        )
        wall_ax.plot(
            line["microbatches"],
            line["util_wall"],
            marker=marker,
            ls=":",
            color=colour,
            label=schedule,
        )
    for ax, what in (
        (replayed_ax, "replayed (solid) vs bound (dashed)"),
        (wall_ax, "wall clock, this host"),
    ):
        ax.set(ylabel="utilization", ylim=(0, 1.02), title=f"P = {p}: {what}")
    replayed_ax.legend(fontsize=7, ncol=2, loc="lower right")


def _draw_memory(memory_ax: Any, count_ax: Any, p: int, group: pd.DataFrame, styles: dict) -> None:
    for schedule, colour, marker, line in _lines(group, styles):
        style = {"marker": marker, "color": colour, "label": schedule, "alpha": 0.85}
        memory_ax.plot(line["microbatches"], line["peak_activation_bytes"] / 2**20, **style)
        count_ax.plot(line["microbatches"], line["max_inflight_microbatches"], **style)
    count_ax.axhline(p, color="black", lw=0.8, ls="--", label="P (1F1B's limit)")
    memory_ax.set(
        ylabel="peak activation MiB (busiest rank)",
        title=f"P = {p}: peak saved activations",
        ylim=(0, None),
    )
    count_ax.set(
        ylabel="micro-batches held at once",
        title=f"P = {p}: max in-flight (measured; interleaved: chunks)",
    )
    count_ax.legend(fontsize=7)


def _gantt_panel(ax: Any, spans: pd.DataFrame, title: str) -> None:
    ranks = sorted(int(r) for r in spans["rank"].unique())
    scale = 1e3  # ms
    for row in spans.itertuples():
        colour = KIND_COLOURS.get(row.kind)
        y = row.rank
        start, width = row.start_s * scale, (row.end_s - row.start_s) * scale
        if colour is None:  # a transfer round (wall clock only): a thin grey bar
            ax.barh(y + 0.33, width, left=start, height=0.12, color="0.6")
            continue
        ax.barh(y, width, left=start, height=0.6, color=colour, edgecolor="white", lw=0.5)
        ax.text(
            start + width / 2,
            y,
            f"{row.kind}{row.microbatch}",
            ha="center",
            va="center",
            fontsize=6,
            color="white",
            clip_on=True,
        )
    ax.set_yticks(ranks, [f"rank {r}" for r in ranks])
    ax.invert_yaxis()
    ax.set(xlabel="time (ms)", title=title)


def gantt(cells: list[tuple[str, pd.Series, pd.DataFrame]]) -> Figure:
    """One row per (label, row, spans): the replayed timeline beside the wall clock."""
    fig, axes = new_figure(13, 2.6 * len(cells) + 0.6, rows=len(cells), cols=2)
    for i, (label, cell, spans) in enumerate(cells):
        util = {"replayed": cell["util_replayed"], "wall": cell["util_wall"]}
        for j, timeline in enumerate(("replayed", "wall")):
            part = spans[spans["timeline"] == timeline]
            name = "replayed (own device per rank)" if timeline == "replayed" else "wall clock"
            _gantt_panel(
                axes[2 * i + j],
                part,
                f"{label}: {name}, utilization {format_percent(util[timeline])}",
            )
    kinds = set().union(*(set(spans["kind"]) for _, _, spans in cells))
    handles = [Patch(color=c, label=k) for k, c in KIND_COLOURS.items() if k in kinds]
    handles.append(Patch(color="0.6", label="transfer round (wall clock)"))
    fig.legend(handles=handles, loc="lower center", ncol=len(handles), fontsize=8)
    fig.suptitle("Naive pipeline vs GPipe: one measured step (F = forward, B = backward)")
    fig.subplots_adjust(hspace=0.55, bottom=0.12)
    return fig
