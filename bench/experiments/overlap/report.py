"""The `overlap` report: DDP's step time with its bucket all-reduces overlapped with
backward and without, per bucket size, on loopback and on a simulated link.

Every measured number is read from the rows. The one theory figure is Li et al.'s (VLDB
2020, "PyTorch Distributed"): overlapped, a step ideally takes forward + max(backward,
all-reduce) + optimizer instead of their sum. Buckets refine it: the last bucket holds
the gradients backward produces last and cannot start before backward ends, so overlap
saves at most min(backward, all-reduce − last bucket's all-reduce). The "ideal" shown
beside each pair is that bound evaluated on the serial cell's own measured times —
derived from measurements, and labelled so. Issue #4's target (overlapped faster than
serial) is judged on every pair with several buckets on a simulated link; loopback pairs
are shown beside, and whether overlap pays there is a finding.
"""

from __future__ import annotations

import math
from functools import partial

import pandas as pd

from bench.experiments.overlap.pairs import (
    IDEAL_SOURCE,
    best_per_network,
    flag,
    number,
    pairs,
    whole,
)
from bench.experiments.overlap.plots import hidden_figure, step_time_figure
from bench.experiments.overlap.sections import every_cell, replicas_agree, speedup_lines
from bench.report import (
    Context,
    Report,
    Target,
    format_bytes,
    format_percent,
    format_ratio,
    format_seconds,
    markdown_table,
    ok_rows,
    prose,
)

__all__ = ["IDEAL_SOURCE", "REPORT", "SPEEDUP_TARGET", "pairs", "prepare"]

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros

SPEEDUP_TARGET = Target(
    figure="DDP serial ÷ overlapped step time, each bucket cap with several buckets on the "
    "simulated link",
    column="pair_speedup",
    op=">",
    bound=1.0,
    source="issue #4: overlapped DDP faster than the same DDP without overlap",
    where={"overlap": True, "link": "simulated", "several_buckets": True},
    wall_clock=True,
)


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """`link` (loopback or simulated), `several_buckets`, and on each overlapped cell its
    pair's speed-up (serial ÷ overlapped, as the pairs table gives it)."""
    df = df.copy()
    if not {"network", "bucket_cap_bytes", "overlap"} <= set(df.columns):
        return df
    df["link"] = df["network"].map(lambda n: "loopback" if n == "loopback" else "simulated")
    df["several_buckets"] = pd.to_numeric(df.get("buckets"), errors="coerce") > 1
    df["pair_speedup"] = math.nan
    ok = ok_rows(df)
    if "step_time_s" not in ok.columns or ok.empty:
        return df
    table = pairs(ok)
    speedup = {(r.network, r.bucket_cap_bytes): r.speedup for r in table.itertuples()}
    on = flag(df["overlap"]) & df.index.isin(ok.index)
    for index in df.index[on]:
        key = (df.at[index, "network"], df.at[index, "bucket_cap_bytes"])
        df.at[index, "pair_speedup"] = speedup.get(key, math.nan)
    return df


def what_was_measured(ctx: Context) -> str | None:
    """What was measured, on what

    **overlap on**: the buckets are all-reduced on DDP's communication thread (its own
    process group) as backward produces them; **off**: the same buckets, all-reduced one
    after the other once backward has returned. **Step time**: barrier, then forward,
    backward, gradient sync and the optimizer step; the slowest rank's, median over
    steps. **All-reduce**: Σ over buckets of each all-reduce's start to finish (slowest
    rank, median step). **Exposed sync**: from the end of backward to the last bucket's
    finish — what the step still waited for. **Hidden fraction**: the share of the
    all-reduce time that fell before backward ended (mean of the ranks, median step).
    **Simulated**: the seconds the modelled link added per step. **Bytes / step**: what
    the busiest rank sent, counted by distbench's communicators."""
    ok = ctx.ok
    first = ok.iloc[0]
    shape = ", ".join(
        f"{c.removeprefix('model_')}={whole(number(first, c))}"
        for c in ok.columns
        if c.startswith("model_") and pd.notna(first[c])
    )
    links = []
    for network in pd.unique(ok["network"]):
        if network == "loopback":
            links.append(_prose("loopback_link"))
            continue
        row = ok[ok["network"] == network].iloc[0]
        bandwidth = number(row, "bandwidth_mbps")
        links.append(
            _prose(
                "simulated_link",
                network=network,
                latency=f"{number(row, 'latency_ms'):g}",
                bandwidth=f"{bandwidth:g} Mbit/s" if math.isfinite(bandwidth) else None,
            )
        )
    count = {k: whole(number(first, k)) for k in ("world_size", "batch_size", "steps")}
    return _prose(
        "measured",
        shape=shape,
        params=format(whole(number(first, "params")), ","),
        grad=format_bytes(number(first, "grad_bytes")),
        ranks=count["world_size"],
        batch=count["batch_size"],
        steps=count["steps"],
        links=links,
    )


def _pairs_table(table: pd.DataFrame) -> str:
    return markdown_table(
        pd.DataFrame(
            {
                "network": table["network"],
                "bucket cap": table["bucket_cap_bytes"].map(format_bytes),
                "buckets": table["buckets"],
                "step, off": table["serial_step_s"].map(format_seconds),
                "step, on": table["overlap_step_s"].map(format_seconds),
                "speed-up (off ÷ on)": table["speedup"].map(format_ratio),
                "basis": table["speedup_basis"],
                "across cells": table["separate_speedup"].map(format_ratio),
                "ideal (derived)": table["ideal_speedup"].map(format_ratio),
                "hidden": table["hidden_fraction"].map(lambda v: format_percent(v, 0)),
                "hideable (derived)": table["hideable_fraction"].map(
                    lambda v: format_percent(v, 0)
                ),
            }
        )
    )


def _figures_and_findings(ctx: Context, table: pd.DataFrame, best: dict[str, dict]) -> None:
    for network, b in best.items():
        cap = format_bytes(b["bucket_cap_bytes"])
        ideal, hideable = b["ideal_speedup"], b["hideable_fraction"]
        # The ideal is Li et al.'s model evaluated on the serial cell's measured times: a
        # model's output, in a column of its own.
        ctx.figure(
            _prose("speedup_figure", network=network, cap=cap),
            source=IDEAL_SOURCE,
            measured=format_ratio(b["speedup"]),
            model=f"≤ {format_ratio(ideal)} (ideal on the serial cell's times)",
            gap=f"{b['speedup'] - ideal:+.2f}×" if math.isfinite(ideal) else "—",
        )
        ctx.figure(
            _prose("hidden_figure", network=network, cap=cap),
            source=IDEAL_SOURCE,
            measured=format_percent(b["hidden_fraction"], 0),
            model=f"≤ {format_percent(hideable, 0)} (hideable on the serial cell's times)",
            gap=f"{100 * (b['hidden_fraction'] - hideable):+.0f} points"
            if math.isfinite(hideable)
            else "—",
        )
    loopback = table[(table["network"] == "loopback") & (table["buckets"] > 1)]
    if len(loopback):
        slower = loopback[~(loopback["speedup"] > 1)]
        ctx.finding(
            _prose("loopback_finding"),
            slower.empty,
            "; ".join(
                f"{format_bytes(r.bucket_cap_bytes)}: {format_ratio(r.speedup)} ({r.speedup_basis})"
                for r in slower.itertuples()
            ),
        )


def what_overlap_buys(ctx: Context) -> str | None:
    """What overlap buys, per bucket size

    Serial and overlapped cells of the same network and cap. **Step, off / on**: the
    setting's median step time, averaged with its twin's median in the other cell where
    the cells ran paired. **Speed-up**: serial ÷ overlapped; *paired*: the geometric
    mean of the two cells' side-by-side ratios (each cell alternated its steps with a
    twin replica running the other setting, so drift on a shared host hits both alike);
    *across cells*: the ratio of the two cells' own medians, which such drift can bias.
    **Ideal (derived)**: serial step ÷ (serial step − S) with S = min(backward,
    all-reduce − last bucket's all-reduce), all three the serial cell's measured times —
    the most overlap could save if an all-reduce running beside backward slowed neither
    (Li et al., VLDB 2020; the last bucket holds the gradients backward produces last,
    so it cannot start before backward ends). **Hideable**: S ÷ all-reduce, the same
    bound as a share of the all-reduce time. With one bucket both are 1× / 0%: nothing
    is ready to send while backward runs."""
    ok = ctx.ok
    table = pairs(ok) if not ok.empty else pd.DataFrame()
    best = best_per_network(table) if len(table) else {}
    ctx.headline["best_per_network"] = best
    if ok.empty:
        return None
    shown = [
        ctx.plot(
            step_time_figure(ok, table), "step_time_vs_bucket", "step time against bucket size"
        ),
        ctx.plot(hidden_figure(ok), "hidden_fraction", "hidden fraction and exposed sync"),
    ]
    if not len(table):
        return "\n\n".join([*shown, _prose("no_pairs")])
    _figures_and_findings(ctx, table, best)
    return "\n\n".join([*shown, _pairs_table(table), speedup_lines(ctx, table, best)])


REPORT = Report(
    title="Overlapping DDP's gradient all-reduces with backward",
    intro=_prose("intro"),
    sections=(what_was_measured, what_overlap_buys, every_cell, replicas_agree),
    targets=(SPEEDUP_TARGET,),
    prepare=prepare,
    correctness=_prose("correctness"),
)
