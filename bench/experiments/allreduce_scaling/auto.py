"""`auto` against the from-scratch algorithms it chooses from (issue #14).

In every (N, M) cell the *measured best* is the from-scratch algorithm with the highest
busbw relative to torch (`busbw_vs_torch`, each paired with torch's all-reduce in its own
cell). `prepare` adds to each auto row: that algorithm (`best_algorithm`), auto's own
paired ratio over the best's (`auto_vs_best`, the issue's ≥ 0.9× target), the same for
the algorithm auto chose but read from that algorithm's own cell (`choice_vs_best`: the
quality of the choice, free of the auto cell's own timing noise) and whether it chose
the best (`auto_chose_best`). The share of cells where it did (≥ 80%) is one number over
the grid, not a per-cell bound, so it is a headline figure and a finding, not a `Target`.
"""

from __future__ import annotations

import math

import pandas as pd

from bench.report import (
    Context,
    Target,
    format_bytes,
    format_percent,
    format_ratio,
    format_seconds,
    markdown_table,
)

__all__ = ["AUTO_VS_BEST", "BEST_SHARE_BOUND", "auto_choices", "prepare"]

CELL = ["world_size", "message_bytes"]
NOT_FROM_SCRATCH = ("auto", "torch")  # every other algorithm is one auto chooses from
BEST_SHARE_BOUND = 0.8
AUTO_VS_BEST = Target(
    figure="auto busbw_vs_torch ÷ the best from-scratch algorithm's, every (N, M)",
    column="auto_vs_best",
    op=">=",
    bound=0.9,
    source="issue #14",
    where={"algorithm": "auto"},
    wall_clock=True,
)


def _ok(df: pd.DataFrame) -> pd.DataFrame:
    return df[df["status"] == "ok"] if "status" in df.columns else df


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """Add `best_algorithm`, `auto_vs_best`, `choice_vs_best`, `auto_chose_best` to auto rows."""
    for column in ("auto_vs_best", "choice_vs_best", "auto_chose_best"):
        df[column] = math.nan
    df["best_algorithm"] = None
    if "algorithm" not in df.columns or "busbw_vs_torch" not in df.columns:
        return df
    ok = _ok(df)
    ours = ok[~ok["algorithm"].isin(NOT_FROM_SCRATCH)]
    ratio = ours.assign(r=pd.to_numeric(ours["busbw_vs_torch"], errors="coerce"))
    ratio = ratio[ratio["r"].map(math.isfinite) & (ratio["r"] > 0)]
    by_cell = {cell: rows.set_index("algorithm")["r"] for cell, rows in ratio.groupby(CELL)}
    for index, row in ok[ok["algorithm"] == "auto"].iterrows():
        cell = (row["world_size"], row["message_bytes"])
        if cell not in by_cell:
            continue
        ratios = by_cell[cell]
        best = str(ratios.idxmax())
        own = pd.to_numeric(pd.Series([row["busbw_vs_torch"]]), errors="coerce").iloc[0]
        choice = row.get("auto_choice")
        df.loc[index, "best_algorithm"] = best
        df.loc[index, "auto_vs_best"] = own / ratios[best]
        df.loc[index, "choice_vs_best"] = ratios.get(choice, math.nan) / ratios[best]
        df.loc[index, "auto_chose_best"] = float(choice == best)
    return df


def auto_choices(ctx: Context) -> str | None:
    """auto's choice per (N, M) against the measured best

    `auto` runs the algorithm an `AllReduceTuner` predicts fastest, t = α + β·M per
    algorithm and N, fitted on this rank pool before the first auto cell: each algorithm
    timed at the grid's smallest and largest M, in turns, the slowest rank's time (NCCL's
    latency + size/bandwidth model, calibrated here as NCCL's constants are per platform;
    MPICH's selection, Thakur et al. 2005). The auto cell is then timed like every other
    cell. *Measured best*: the from-scratch algorithm with the highest busbw ÷ torch in
    that (N, M); *auto ÷ best*: auto's own cell against it (the ≥ 0.9× target); *choice ÷
    best*: the chosen algorithm's own cell against it, i.e. what the choice cost apart
    from the auto cell's own timing noise. *predicted*: the tuner's time for its choice."""
    rows = ctx.ok[(ctx.ok["algorithm"] == "auto")] if "algorithm" in ctx.ok else ctx.ok
    if rows.empty or "auto_chose_best" not in rows.columns:
        return None
    judged = rows[rows["auto_chose_best"].notna()].sort_values(CELL)
    if judged.empty:
        return "No auto cell has a measured best to compare with."
    share = float(judged["auto_chose_best"].mean())
    near = float((judged["choice_vs_best"] >= AUTO_VS_BEST.bound).mean())
    table = pd.DataFrame({
        "N": judged["world_size"].astype(int),
        "M": judged["message_bytes"].map(format_bytes),
        "auto chose": judged["auto_choice"],
        "measured best": judged["best_algorithm"],
        "auto ÷ best": judged["auto_vs_best"].map(format_ratio),
        "choice ÷ best": judged["choice_vs_best"].map(format_ratio),
        "auto time": judged["time_s"].map(format_seconds),
        "predicted": judged["auto_predicted_s"].map(format_seconds),
    })  # fmt: skip
    met = share >= BEST_SHARE_BOUND
    cells = f"{int(judged['auto_chose_best'].sum())} of {len(judged)} cells"
    ctx.headline.update(auto_best_choice_share=share, auto_best_choice_cells=len(judged),
                        auto_near_best_share=near,
                        auto_choice_vs_best_median=float(judged["choice_vs_best"].median()),
                        auto_vs_best_worst=float(judged["auto_vs_best"].min()))  # fmt: skip
    ctx.figure("auto chose the measured-best from-scratch algorithm (share of (N, M) cells)",
               theory=f"≥ {format_percent(BEST_SHARE_BOUND, 0)}", source="issue #14",
               measured=f"{format_percent(share, 0)} ({cells})",
               gap="met" if met else "not met")  # fmt: skip
    ctx.finding("auto chooses the measured-best algorithm in ≥ 80% of cells (issue #14)", met,
                f"{format_percent(share, 0)}: {cells}")  # fmt: skip
    summary = (
        f"auto chose the measured best in **{cells} ({format_percent(share, 0)}; "
        f"target ≥ {format_percent(BEST_SHARE_BOUND, 0)}: {'met' if met else 'not met'})**; "
        f"its choice's own cell was within 0.9× of the best in {format_percent(near, 0)}."
    )
    if ctx.cores == ctx.cores and (rows["world_size"] > ctx.cores).any():
        summary += (
            f" Cells with more ranks than the host's {int(ctx.cores)} cores are judged "
            "too; there a window's time swings by several times between phases of the host."
        )
    return f"{summary}\n\n{markdown_table(table, numparse=False)}"
