"""Report for `collectives`: an nccl-tests style table, distbench against torch.distributed.

Every collective is timed twice in one run, distbench's from-scratch version (built on the
counted point-to-point layer) and torch.distributed's own, at the same world size and size
S, where S is what nccl-tests calls the size for that collective. busbw = algbw × a bus
factor that makes the number comparable to a link's bandwidth; the report derives each
factor and prints the ratio distbench busbw / torch busbw per cell.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import seaborn as sns

from bench.reports import (
    failed_cells_markdown,
    failures_list,
    figure_row,
    format_bytes,
    format_ratio,
    format_seconds,
    log2_axis,
    markdown_table,
    new_figure,
    ok_rows,
    run_context,
    save_figure,
    to_jsonable,
    write_headline,
    write_text_atomic,
)

__all__ = ["BUS_FACTORS", "COLLECTIVE_ORDER", "write_report"]

COLLECTIVE_ORDER = (
    "broadcast",
    "reduce",
    "scatter",
    "gather",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "all_reduce",
)
# collective -> (factor, why), after nccl-tests doc/PERFORMANCE.md; n ranks, S bytes.
BUS_FACTORS: dict[str, tuple[str, str]] = {
    "broadcast": (
        "1",
        "S is the buffer the root holds; every rank must receive all S bytes once, and a "
        "pipelined chain moves S across each link, so algbw already is the link rate.",
    ),
    "reduce": (
        "1",
        "S is each rank's buffer; the root must take in S bytes of combined data, and a "
        "pipelined chain carries S per link, as broadcast in reverse.",
    ),
    "scatter": (
        "(n−1)/n",
        "S is the root's whole buffer; the root keeps its own 1/n and must push the other "
        "(n−1)/n of S through its link.",
    ),
    "gather": (
        "(n−1)/n",
        "S is the gathered result; the root already holds 1/n and must pull in (n−1)/n of S.",
    ),
    "all_gather": (
        "(n−1)/n",
        "S is the gathered output; each rank starts with S/n and must receive the other "
        "n−1 pieces, (n−1)/n of S.",
    ),
    "reduce_scatter": (
        "(n−1)/n",
        "S is each rank's input; a rank ends with S/n reduced and must receive the other "
        "n−1 ranks' contributions to it, (n−1)/n of S in all.",
    ),
    "all_to_all": (
        "(n−1)/n",
        "S is each rank's buffer; a rank keeps the 1/n addressed to itself and exchanges "
        "the remaining (n−1)/n of S.",
    ),
    "all_reduce": (
        "2(n−1)/n",
        "a reduce-scatter ((n−1)/n of S into each rank) followed by an all-gather (another "
        "(n−1)/n out): 2(n−1)/n of S per rank, the lower bound ring all-reduce meets.",
    ),
}
IMPLS = ("distbench", "torch")


def _collectives(df: pd.DataFrame) -> list[str]:
    present = {str(c) for c in pd.unique(df["collective"])}
    return [c for c in COLLECTIVE_ORDER if c in present] + sorted(present - set(COLLECTIVE_ORDER))


def _wide(df: pd.DataFrame) -> pd.DataFrame:
    """One row per (collective, N, S); columns `<metric>_<impl>` plus `ratio`."""
    ok = ok_rows(df)
    keys = ["collective", "world_size", "message_bytes"]
    metrics = ["time_s", "algbw_gbps", "busbw_gbps", "wrong"]
    aggregate = {metric: "max" if metric == "wrong" else "median" for metric in metrics}
    wide = ok.pivot_table(index=keys, columns="impl", values=metrics, aggfunc=aggregate)
    wide.columns = [f"{metric}_{impl}" for metric, impl in wide.columns]
    for metric in metrics:
        for impl in IMPLS:
            if f"{metric}_{impl}" not in wide.columns:
                wide[f"{metric}_{impl}"] = np.nan
    wide["ratio"] = wide["busbw_gbps_distbench"] / wide["busbw_gbps_torch"]
    if "busbw_vs_torch" in ok.columns:
        # Prefer the paired ratio: torch timed in windows alternating with distbench's, same
        # cell and buffers (see bench/timing.py); separate cells are the fallback.
        mine = ok[ok["impl"] == "distbench"].groupby(keys)["busbw_vs_torch"].median()
        paired = mine.reindex(wide.index)
        wide["ratio"] = paired.where(paired.notna(), wide["ratio"])
    return wide.reset_index()


def _collective_table(wide: pd.DataFrame, collective: str) -> str:
    rows = wide[wide["collective"] == collective].sort_values(["world_size", "message_bytes"])
    table = pd.DataFrame(
        {
            "N": rows["world_size"].astype(int),
            "size S": rows["message_bytes"].map(format_bytes),
            "time distbench": rows["time_s_distbench"].map(format_seconds),
            "time torch": rows["time_s_torch"].map(format_seconds),
            "algbw distbench (GB/s)": rows["algbw_gbps_distbench"].map(lambda v: f"{v:.3g}"),
            "algbw torch (GB/s)": rows["algbw_gbps_torch"].map(lambda v: f"{v:.3g}"),
            "busbw distbench (GB/s)": rows["busbw_gbps_distbench"].map(lambda v: f"{v:.3g}"),
            "busbw torch (GB/s)": rows["busbw_gbps_torch"].map(lambda v: f"{v:.3g}"),
            "#wrong distbench": rows["wrong_distbench"].map(_count),
            "#wrong torch": rows["wrong_torch"].map(_count),
            "busbw distbench/torch": rows["ratio"].map(format_ratio),
        }
    )
    return markdown_table(table.replace("nan", "—"))


def _count(value: float) -> str:
    return "—" if not np.isfinite(value) else str(int(value))


def _largest_size_medians(wide: pd.DataFrame, order: list[str]) -> dict[str, float]:
    """Per collective, the median over N of the ratio at its largest size with a ratio."""
    rated = wide.dropna(subset=["ratio"])
    medians = {}
    for collective in order:
        rows = rated[rated["collective"] == collective]
        if not rows.empty:
            largest = rows[rows["message_bytes"] == rows["message_bytes"].max()]
            medians[collective] = float(largest["ratio"].median())
    return medians


def _plot_busbw(ok: pd.DataFrame, order: list[str], path: Path) -> None:
    columns = min(4, len(order))
    grid_rows = math.ceil(len(order) / columns)
    data = ok.assign(N=ok["world_size"].map(lambda n: f"N={int(n)}"))
    hue_order = [f"N={n}" for n in sorted(ok["world_size"].unique())]
    sizes = sorted(ok["message_bytes"].unique())
    ticks = sizes[:: max(1, len(sizes) // 4)]
    fig, axes = new_figure(4.2 * columns + 1.5, 3.6 * grid_rows, grid_rows, columns, sharex=True)
    for i, ax in enumerate(axes):
        if i >= len(order):
            ax.set_visible(False)
            continue
        last = i == len(order) - 1
        sns.lineplot(
            data=data[data["collective"] == order[i]], x="message_bytes", y="busbw_gbps",
            hue="N", hue_order=hue_order, style="impl", style_order=list(IMPLS),
            markers=True, ax=ax, legend=last,
        )  # fmt: skip
        log2_axis(ax, ticks, as_bytes=True)
        ax.set(title=order[i], xlabel="size S", ylabel="busbw (GB/s)")
        if last:
            sns.move_legend(ax, "upper left", bbox_to_anchor=(1.02, 1))
    fig.suptitle("Bus bandwidth vs size per collective: distbench (solid) vs torch (dashed)")
    save_figure(fig, path)


def _setup_section(df: pd.DataFrame) -> str:
    sizes = sorted(df["world_size"].dropna().astype(int).unique())
    return (
        "## What was measured, on what\n\n"
        f"Each collective ran on N ∈ {{{', '.join(map(str, sizes))}}} ranks, distbench's "
        f"implementation and torch.distributed's side by side. {run_context(df)} Time is the "
        "median over repeats of the slowest rank; algbw = S / time, busbw = algbw × bus "
        "factor (below). The ratio distbench/torch is paired: inside each distbench cell, "
        "torch's collective is timed on the same buffers in windows alternating with "
        "distbench's, so machine drift affects both alike.\n"
    )


def _factor_section(order: list[str]) -> str:
    lines = [
        f"- `{c}`: **{BUS_FACTORS[c][0]}**: {BUS_FACTORS[c][1]}" for c in order if c in BUS_FACTORS
    ]
    return (
        "## Bus factors\n\nbusbw = algbw × factor, so that a collective running at a link's "
        "full speed reads as that link's bandwidth whatever n is (nccl-tests' convention):\n\n"
        + "\n".join(lines)
        + "\n"
    )


def _min_ratio_cell(wide: pd.DataFrame) -> pd.Series | None:
    rated = wide.dropna(subset=["ratio"])
    return None if rated.empty else rated.loc[rated["ratio"].idxmin()]


def _figures(
    medians: dict[str, float | None], worst: pd.Series | None, wrong_total: int, failed: int,
    largest: dict[str, int],
) -> list[dict[str, str]]:  # fmt: skip
    figures = []
    for collective, ratio in medians.items():
        figures.append(figure_row(
            f"{collective} busbw distbench ÷ torch (S = {format_bytes(largest[collective])}, "
            "median over N)", "—", "torch.distributed, same run", format_ratio(ratio), "—",
        ))  # fmt: skip
    if worst is not None:
        figures.append(figure_row(
            f"lowest busbw ratio ({worst['collective']}, N={int(worst['world_size'])}, "
            f"{format_bytes(worst['message_bytes'])})", "—", "torch.distributed, same run",
            format_ratio(worst["ratio"]), "—",
        ))  # fmt: skip
    figures.append(figure_row("wrong elements", "0", "reference check", str(wrong_total),
                              f"{wrong_total:+d}"))  # fmt: skip
    figures.append(figure_row("failed cells", "0", "grid", str(failed), f"{failed:+d}"))
    return figures


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, busbw_by_collective.png and headline.json; return the headline."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    order = _collectives(df)
    wide = _wide(df)
    ok = ok_rows(df)
    if not ok.empty:
        _plot_busbw(ok, [c for c in order if c in set(ok["collective"])],
                    report_dir / "busbw_by_collective.png")  # fmt: skip
    wrong_total = int(np.nansum(pd.to_numeric(df["wrong"], errors="coerce")))
    failures = failures_list(df, ["collective", "impl", "world_size", "message_bytes"])
    medians = _largest_size_medians(wide, order)
    largest = {
        str(c): int(rows["message_bytes"].max())
        for c, rows in wide.dropna(subset=["ratio"]).groupby("collective")
    }
    worst = _min_ratio_cell(wide)
    tables = "\n".join(
        f"### `{collective}`\n\n{_collective_table(wide, collective)}\n" for collective in order
    )
    median_text = ", ".join(f"{c} {format_ratio(r)}" for c, r in medians.items()) or "none"
    plot = "![busbw_by_collective](busbw_by_collective.png)\n" if not ok.empty else ""
    text = "\n".join(
        [
            "# Collectives: distbench against torch.distributed, nccl-tests style\n",
            _setup_section(df),
            _factor_section(order),
            "## Results\n\nMeasured; ratio = distbench busbw / torch busbw in the same cell. "
            f"Median ratio over N at each collective's largest size: {median_text}.\n",
            tables,
            "## Correctness and failures\n\n"
            f"Wrong elements against the reference, all cells: "
            f"{'all zero' if wrong_total == 0 else f'**{wrong_total} wrong elements**'}.\n\n"
            + failed_cells_markdown(failures),
            "## Plot\n",
            plot,
        ]
    )
    write_text_atomic(report_dir / "report.md", text)
    headline = {
        "experiment": "collectives",
        "min_ratio": float(worst["ratio"]) if worst is not None else None,
        "min_ratio_cell": (
            {k: worst[k] for k in ("collective", "world_size", "message_bytes")}
            if worst is not None
            else None
        ),
        "median_ratio_largest_size": medians,
        "wrong_total": wrong_total,
        "failed_cells": len(failures),
        "failures": failures,
        "figures": _figures(medians, worst, wrong_total, len(failures), largest),
    }
    write_headline(report_dir, headline)
    return to_jsonable(headline)
