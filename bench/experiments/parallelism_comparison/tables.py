"""The lecture's table for `parallelism_comparison`: each layout beside the lecture's words
for its strategy, the orderings those words claim (checked, as findings), the index's
figures (ratios to DP at the same world size) and what the papers' counts say about the
orderings for this model. Every helper tolerates missing, zero and NaN figures."""

from __future__ import annotations

import math
from functools import partial
from itertools import pairwise
from typing import Any

import numpy as np
import pandas as pd

from bench.report import (
    Context,
    format_bytes,
    format_percent,
    format_ratio,
    format_seconds,
    prose,
)

__all__ = [
    "BUBBLE_SOURCE",
    "LECTURE",
    "count",
    "figures_and_headline",
    "lecture_rows",
    "number",
    "orderings",
    "pure",
    "ratio",
    "why_text",
]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros

LECTURE_SOURCE = 'lecture 004, "Comparing Different Parallelization Strategies"'
LECTURE = {  # strategy -> the lecture's words for utilization, memory, communication
    "DP": ("high", "high", "low"),
    "TP": ("balanced", "lower", "higher"),
    "PP": ("low", "low", "medium"),
    "2D": ("—", "—", "—"),
    "3D": ("—", "—", "—"),
}
BUBBLE_SOURCE = "GPipe (Huang et al. 2019), §2.3: M/(M+pp−1)"
MEMORY_SOURCE = "one model copy cut k = pp·tp ways (Megatron-LM, Shoeybi et al. 2019, §3)"
COMM_SOURCE = "Megatron-LM §3 (TP) vs one ring all-reduce of the gradients (DP)"
# (column, order the lecture claims, largest first; what it is)
ORDERINGS = (
    ("util_replayed", ("DP", "TP", "PP"), "utilization (replayed)"),
    ("model_state_bytes", ("DP", "TP"), "model states per rank"),
    ("model_state_bytes", ("DP", "PP"), "model states per rank"),
    ("memory_per_rank_bytes", ("DP", "TP"), "memory per rank"),
    ("memory_per_rank_bytes", ("DP", "PP"), "memory per rank"),
    ("comm_bytes_per_step", ("TP", "PP", "DP"), "communication per step"),
)


def number(value: Any) -> float:
    """`value` as a float; NaN when it is missing or not a number."""
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def count(value: Any, grouped: bool = False) -> str:
    """An integer as text (`grouped`: 54,048); "—" when missing."""
    value = number(value)
    if not math.isfinite(value):
        return "—"
    return f"{int(value):,}" if grouped else str(int(value))


def ratio(a: Any, b: Any) -> Any:
    """a ÷ b, NaN where b is 0 or missing (never a division error); a Series for a Series."""
    top, bottom = np.asarray(a, dtype=float), np.asarray(b, dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        out = np.where(bottom == 0, np.nan, top / bottom)
    return pd.Series(out, index=a.index) if isinstance(a, pd.Series) else float(out)


def pure(rows: pd.DataFrame, n: int, strategy: str) -> pd.Series | None:
    """The layout that is `strategy` alone on all `n` ranks (e.g. dp = n), if it ran."""
    axis = strategy.lower()
    hit = rows[(rows["world_size"] == n) & (rows["strategy"] == strategy) & (rows[axis] == n)]
    return None if hit.empty else hit.iloc[0]


def lecture_rows(ok: pd.DataFrame, n: int, rows: pd.DataFrame) -> pd.DataFrame:
    """The table at `n` ranks: each layout's figures beside the lecture's words."""
    dp = pure(ok, n, "DP")

    def vs_dp(column: str) -> pd.Series:
        return ratio(rows[column], math.nan if dp is None else dp[column]).map(format_ratio)

    words = rows["strategy"].map(lambda s: LECTURE.get(s, ("—",) * 3))
    return pd.DataFrame(
        {
            "strategy": rows["strategy"],
            "layout": rows["layout"],
            "utilization (replayed)": rows["util_replayed"].map(format_percent),
            "utilization (wall clock)": rows["util_wall"].map(format_percent),
            "bubble bound": rows["util_theory"].map(format_percent),
            "lecture: utilization": words.map(lambda w: w[0]),
            "memory per rank": rows["memory_per_rank_bytes"].map(format_bytes),
            "model states": rows["model_state_bytes"].map(format_bytes),
            "model states ÷ DP": vs_dp("model_state_bytes"),
            "saved activations": rows["activation_peak_bytes"].map(format_bytes),
            "lecture: memory": words.map(lambda w: w[1]),
            "communication per step": rows["comm_bytes_per_step"].map(format_bytes),
            "comm ÷ DP": vs_dp("comm_bytes_per_step"),
            "lecture: communication": words.map(lambda w: w[2]),
            "step time (wall)": rows["step_time_s"].map(format_seconds),
            "step time (replayed)": rows["replayed_step_time_s"].map(format_seconds),
            "wrong": rows["wrong"].map(count),
        }
    )


def _shown(column: str, value: float) -> str:
    return format_percent(value) if column.startswith("util") else format_bytes(value)


def orderings(ctx: Context, n: int) -> list[str]:
    """Each ordering the lecture's words claim between the pure layouts at `n` ranks: a
    line for the report and a finding for the index. An ordering holds only if each value
    is strictly larger than the next (a tie, a zero or a NaN does not hold)."""
    lines = []
    for column, order, what in ORDERINGS:
        present = [(s, row) for s in order if (row := pure(ctx.ok, n, s)) is not None]
        if len(present) < 2:
            lines.append(_prose("too_few", what=what, order="/".join(order), n=n))
            continue
        values = [(s, number(row[column])) for s, row in present]
        claim = " > ".join(s for s, _ in values)
        holds = all(a > b for (_, a), (_, b) in pairwise(values))
        measured = sorted(values, key=lambda sv: -sv[1] if math.isfinite(sv[1]) else math.inf)
        listing = " > ".join(f"{s} {_shown(column, v)}" for s, v in measured)
        ctx.finding(
            _prose("ordering_finding", what=what, n=n, claim=claim), holds, f"measured {listing}"
        )
        lines.append(_prose("ordering", what=what, listing=listing, claim=claim, holds=holds))
    return lines


def _gap(value: float, digits: int = 2) -> str:
    if not math.isfinite(value):
        return "—"
    return f"{round(value, digits) + 0.0:+.{digits}f}"  # + 0.0: no "-0.00"


def _memory(ctx: Context, n: int, dp: pd.Series, row: pd.Series, name: str, entry: dict) -> None:
    states = ratio(row["model_state_bytes_mean"], dp["model_state_bytes_mean"])
    entry[f"{name.lower()}_model_states_vs_dp"] = states
    entry[f"{name.lower()}_memory_per_rank_vs_dp"] = ratio(
        row["memory_per_rank_bytes"], dp["memory_per_rank_bytes"]
    )
    ctx.figure(
        f"{name} model states per rank (mean) ÷ DP's, N = {n}",
        theory=f"1/{n} = {1 / n:.3f}",
        source=MEMORY_SOURCE,
        measured=f"{states:.3f}",
        gap=_gap(states - 1 / n, 3),
    )


def _communication(ctx: Context, n: int, dp: pd.Series, tp: pd.Series, entry: dict) -> None:
    measured = ratio(tp["comm_bytes_per_step"], dp["comm_bytes_per_step"])
    theory = ratio(tp["predicted_comm_bytes_per_step"], dp["predicted_comm_bytes_per_step"])
    entry["tp_comm_vs_dp"] = measured
    entry["tp_comm_vs_dp_theory"] = theory
    ctx.figure(
        f"TP communication per step ÷ DP's, N = {n}",
        theory=f"{theory:.2f}× (lecture: higher)",
        source=COMM_SOURCE,
        measured=format_ratio(measured),
        gap=f"{_gap(measured - theory)}×",
    )


def _utilization(ctx: Context, n: int, name: str, row: pd.Series, entry: dict) -> None:
    util = number(row["util_replayed"])
    entry[f"{name.lower()}_util_replayed"] = util
    theory, source, gap = f"{LECTURE[name][0]} (lecture)", LECTURE_SOURCE, "—"
    if name == "PP":
        bound = number(row["util_theory"])
        entry["pp_util_bound"] = bound
        theory, source = format_percent(bound), BUBBLE_SOURCE
        gap = f"{_gap(100 * (util - bound), 1)} pts"
    ctx.figure(
        f"{name} utilization, replayed, N = {n}, M = {count(row['microbatches'])}",
        theory=theory,
        source=source,
        measured=format_percent(util),
        gap=gap,
    )


def figures_and_headline(ctx: Context) -> None:
    """The index's figures and `headline.json`'s `by_world_size`: the pure TP and PP
    layouts against pure DP at the same world size, and each one's replayed utilization."""
    by_size = {}
    for n in sorted(int(n) for n in ctx.ok["world_size"].unique()):
        found = {name: pure(ctx.ok, n, name) for name in ("DP", "TP", "PP")}
        dp, entry = found["DP"], {}
        for name in ("TP", "PP"):
            if found[name] is not None and dp is not None:
                _memory(ctx, n, dp, found[name], name, entry)
        if found["TP"] is not None and dp is not None:
            _communication(ctx, n, dp, found["TP"], entry)
        for name, row in found.items():
            if row is not None:
                _utilization(ctx, n, name, row, entry)
        by_size[str(n)] = entry
    ctx.headline["by_world_size"] = by_size


def why_text(ok: pd.DataFrame) -> str:
    """What the counts say about the orderings, with this model's numbers."""
    r = ok.iloc[0]
    psi, layers, h = number(r["params"]), number(r["n_layers"]), number(r["d_model"])
    tokens = number(r["batch_size"]) * number(r["seq_len"])  # B·s of the global batch
    tp_vs_dp, pp_vs_dp = ratio(4 * layers * tokens * h, psi), ratio(tokens * h, psi)
    return _prose(
        "why",
        tp_vs_dp=f"{tp_vs_dp:.2f}",
        layers=count(layers),
        tokens=count(tokens),
        width=count(h),
        psi=count(psi, grouped=True),
        pp_vs_dp=f"{pp_vs_dp:.2f}",
    )
