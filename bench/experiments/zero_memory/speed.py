"""Step time against torch and what overlap buys: the speed targets, the ratio columns
they read (`prepare_ratios`) and the report's step-time section.

A ratio is paired where the cell timed its twin in steps alternating with its own (one
cell, the same ranks, drift hitting both alike), else taken from the twin's own cell at the
same N and precision. Every ratio is judged on every cell it was measured in: the median
beside the worst cell, cells with more ranks than cores labelled, never dropped.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from bench.experiments.zero_memory.methods import TWINS
from bench.experiments.zero_memory.plots import METHODS, methods_in
from bench.report import Context, Target, format_ratio, format_seconds, markdown_table
from bench.report.targets import canonical, select

__all__ = [
    "DDP_VS_TORCH",
    "OVERLAP",
    "SPEED_TARGETS",
    "ZERO3_VS_FSDP2",
    "numeric",
    "prepare_ratios",
    "step_time",
]


def _vs_torch(figure: str, method: str, bound: float) -> Target:
    """`method`'s step time ÷ its torch twin's ≤ `bound`, on every fp32 cell."""
    where = {"method": method, "precision": "fp32"}
    return Target(
        figure=figure,
        column="twin_ratio",
        op="<=",
        bound=bound,
        source="issue #4",
        where=where,
        wall_clock=True,
    )


ZERO3_VS_FSDP2 = _vs_torch(
    "ZeRO-3 step time ÷ torch FSDP2 fully_shard (fp32, every N)", "zero3", 1.25
)
DDP_VS_TORCH = _vs_torch("overlapped DDP step time ÷ torch DDP (fp32, every N)", "ddp", 1.1)
OVERLAP = Target(
    figure="overlapped DDP step time ÷ the same DDP without overlap (fp32, every N > 1: "
    "one rank has nothing to communicate, so nothing to overlap)",
    column="overlap_ratio",
    op="<",
    bound=1.0,
    source="issue #4",
    where={"method": "ddp", "precision": "fp32", "communicates": True},
    wall_clock=True,
)
SPEED_TARGETS = (ZERO3_VS_FSDP2, DDP_VS_TORCH, OVERLAP)
GOALS = {"zero3": ZERO3_VS_FSDP2, "ddp": DDP_VS_TORCH}


def numeric(df: pd.DataFrame, column: str) -> pd.Series:
    """`df[column]` as numbers (NaN where a value, or the whole column, is missing)."""
    if column not in df.columns:
        return pd.Series(math.nan, index=df.index, dtype=float)
    return pd.to_numeric(df[column], errors="coerce")


def _ratio(df: pd.DataFrame, other: pd.Series, paired_column: str) -> tuple[pd.Series, pd.Series]:
    """Each row's step time ÷ method `other[row]`'s at the same N and precision, and its
    basis: the row's paired ratio where it has one, else from the other method's own cell.
    Times and ratios that are not > 0 are no measurement."""
    time = numeric(df, "step_time_s").where(lambda t: t > 0)
    ran = df["status"].eq("ok") if "status" in df.columns else pd.Series(True, index=df.index)
    cell = [df["world_size"].map(canonical), df["precision"].astype(str)]
    index = pd.MultiIndex.from_arrays([*(c[ran] for c in cell), df.loc[ran, "method"].astype(str)])
    times = pd.Series(time[ran].to_numpy(), index=index)
    times = times[~times.index.duplicated()]
    lookup = pd.MultiIndex.from_arrays([*cell, other.astype(str)])
    separate = time / times.reindex(lookup).to_numpy()
    paired = numeric(df, paired_column).where(lambda r: r > 0)
    ratio = paired.where(paired.notna(), separate)
    basis = np.where(paired.notna(), "paired", np.where(separate.notna(), "separate cells", ""))
    return ratio, pd.Series(basis, index=df.index)


def prepare_ratios(df: pd.DataFrame) -> pd.DataFrame:
    """Add `twin_ratio` (÷ torch's twin), `overlap_ratio` (ddp ÷ ddp_no_overlap), their
    bases, and `communicates` (N > 1)."""
    by_method = df["method"].map(TWINS).fillna("")
    named = df["twin"].fillna("").astype(str) if "twin" in df.columns else by_method
    twin = named.where(named != "", by_method)  # a row's own `twin` column comes first
    df["twin_ratio"], df["twin_basis"] = _ratio(df, twin, "step_time_vs_torch")
    no_overlap = df["method"].map({"ddp": "ddp_no_overlap"}).fillna("")
    df["overlap_ratio"], df["overlap_basis"] = _ratio(df, no_overlap, "step_time_vs_no_overlap")
    df["communicates"] = pd.to_numeric(df["world_size"], errors="coerce") > 1
    return df


def _summary(ctx: Context, rows: pd.DataFrame, column: str, basis: str) -> dict | None:
    """Median and worst (largest) of `column` over `rows`, with the worst cell."""
    values = numeric(rows, column).dropna()
    if values.empty:
        return None
    worst = rows.loc[values.idxmax()]
    return {
        "ratio": float(values.max()),
        "median": float(values.median()),
        "cells": len(values),
        "world_size": int(worst["world_size"]),
        "precision": str(worst["precision"]),
        "basis": str(worst[basis]),
        "crowded": ctx.crowded(worst["world_size"]),
    }


def _worst_text(ctx: Context, entry: dict[str, Any]) -> str:
    label = (
        f"; {int(ctx.cores)} cores shared by {entry['world_size']} ranks"
        if entry["crowded"]
        else ""
    )
    return (
        f"{format_ratio(entry['ratio'])} (N = {entry['world_size']}, {entry['precision']}, "
        f"{entry['basis']}{label})"
    )


def _goal(target: Target) -> str:
    return f" (target {target.bound_text.split()[0]} {target.bound:g}×)"


def _line(ctx: Context, label: str, entry: dict | None, goal: str) -> str:
    if entry is None:
        return f"- {label}: not measured"
    return (
        f"- {label}: median {format_ratio(entry['median'])} over {entry['cells']} cells, "
        f"worst {_worst_text(ctx, entry)}{goal}"
    )


def _table(ctx: Context, ok: pd.DataFrame) -> str:
    rows = ok.sort_values(["precision", "world_size", "method"])
    crowded = rows["world_size"].map(
        lambda n: f"{int(n)} (> cores)" if ctx.crowded(n) else str(int(n))
    )
    ratio = [
        f"{format_ratio(r)} ({b})" if b else "—"
        for r, b in zip(rows["twin_ratio"], rows["twin_basis"], strict=True)
    ]
    table = pd.DataFrame(
        {
            "method": rows["method"].map(lambda m: METHODS.get(m, m)),
            "N": crowded,
            "precision": rows["precision"],
            "step time": numeric(rows, "step_time_s").map(format_seconds),
            "torch twin": rows["method"].map(lambda m: METHODS.get(TWINS.get(m, ""), "—")),
            "twin step time (paired)": numeric(rows, "torch_step_time_s").map(format_seconds),
            "ratio (basis)": ratio,
            "÷ no overlap": rows["overlap_ratio"].map(format_ratio),
        }
    )
    return markdown_table(table, numparse=False)


def step_time(ctx: Context) -> str | None:
    """Step time against torch

    Step time as the experiment measured it (`step_time_s`: the median over repeats of the
    slowest rank's step); the twin is torch's implementation of the same stage on the same
    model and ranks, timed side by side in one cell where the basis says paired, else
    taken from the twin's own cell. Each ratio is summarised by its median over the cells
    it was measured in and its worst cell; cells whose ranks outnumbered the host's cores
    are labelled, since ranks there wait for a core as well as for each other."""
    ok = ctx.ok
    if ok.empty or "twin_ratio" not in ok.columns:
        return None
    entries: dict[str, Any] = {}
    lines = []
    for method in [m for m in methods_in(ok) if m in TWINS]:
        entry = _summary(ctx, ok[ok["method"] == method], "twin_ratio", "twin_basis")
        entries[method] = None if entry is None else {**entry, "twin": TWINS[method]}
        goal = _goal(GOALS[method]) if method in GOALS else ""
        lines.append(_line(ctx, f"{METHODS[method]} ÷ {METHODS[TWINS[method]]}", entry, goal))
    ddp = select(ok, OVERLAP.where)  # the cells the overlap target judges
    if not ddp.empty:
        overlap = _summary(ctx, ddp, "overlap_ratio", "overlap_basis")
        entries["ddp_vs_no_overlap"] = overlap and {**overlap, "twin": "ddp_no_overlap"}
        label = f"{METHODS['ddp']} ÷ {METHODS['ddp_no_overlap']} (fp32, N > 1)"
        lines.append(_line(ctx, label, overlap, _goal(OVERLAP)))
    ctx.headline["step_time_vs_torch"] = entries
    _zero1_figure(ctx, entries.get("zero1"))
    return "\n".join(lines) + "\n\n" + _table(ctx, ok)


def _zero1_figure(ctx: Context, entry: dict | None) -> None:
    """ZeRO-1 ÷ ZeroRedundancyOptimizer: no target of the issue's, an index figure."""
    if entry is None:
        return
    ctx.figure(
        f"ZeRO-1 step time ÷ torch ZeroRedundancyOptimizer, median over {entry['cells']} "
        "cells (worst cell)",
        source="torch.distributed, same run",
        measured=f"{format_ratio(entry['median'])}; worst {_worst_text(ctx, entry)}",
    )
