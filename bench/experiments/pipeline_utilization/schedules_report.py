"""The pipeline_utilization report's sections on the schedules themselves: utilization
against the bubble bound, activation memory and in-flight micro-batches, ZB-H1 against
1F1B, and the Gantt charts. Reads results only (never `impls`): each schedule's label,
bound and marker come from its spec through the results' columns (`schedule_label`,
`bound_source`, `marker`, `schedule_rank`, `split_backward`)."""

from __future__ import annotations

import json
import math
from functools import partial
from typing import Any

import pandas as pd

from bench.experiments.pipeline_utilization import plots
from bench.experiments.pipeline_utilization.names import declared, slicing_of
from bench.report import (
    Context,
    format_bytes,
    format_percent,
    format_seconds,
    markdown_table,
    prose,
)

__all__ = [
    "distbench_rows",
    "gantt",
    "memory",
    "points",
    "schedule_order",
    "stage_costs",
    "utilization",
    "zero_bubble",
]

NEAR_BOUND = 0.05  # points of utilization a replay may sit from its bound and "reach" it

_prose = partial(prose, __package__)  # this experiment's prose.md.j2 macros


def points(measured: Any, reference: Any) -> str:
    """`measured − reference` in percentage points, "—" when either is missing."""
    try:
        gap = 100 * (float(measured) - float(reference))
    except (TypeError, ValueError):
        return "—"
    return f"{gap:+.1f} pts" if math.isfinite(gap) else "—"


def distbench_rows(ok: pd.DataFrame) -> pd.DataFrame:
    """The distbench cells that ran on the equal split, with integer P and M (the Alpa-sliced
    ones have a section of their own)."""
    if "schedule" not in ok.columns or ok.empty:
        return ok.iloc[0:0]
    rows = ok[~ok["schedule"].astype(str).str.startswith("torch_")]
    if "slicing" in rows.columns:
        rows = rows[rows["slicing"].map(slicing_of) == "equal"]
    return rows.assign(
        stages=rows["stages"].astype(int), microbatches=rows["microbatches"].astype(int)
    )


def schedule_order(rows: pd.DataFrame) -> list[str]:
    """The schedules of `rows` in the registry's order (`schedule_rank`), then the rest."""
    present = {str(s) for s in pd.unique(rows["schedule"])}
    ranks = declared(rows, "schedule_rank")
    known = sorted((s for s in present if s in ranks), key=lambda s: (float(ranks[s]), s))
    return known + sorted(present - set(known))


def utilization(ctx: Context) -> str | None:
    """Utilization against micro-batches

    Each cell: replayed / wall clock / theory. More micro-batches shrink the fill and drain
    bubble: GPipe and 1F1B approach 1 as M/(M+P−1); interleaving divides the bubble by V;
    ZB-H1 fills most of it with deferred weight-gradient work. Tables for more ranks than
    the host has cores are labelled: their wall clock counts waits for a core."""
    rows = distbench_rows(ctx.ok)
    if rows.empty:
        return None
    order = schedule_order(rows)
    sources = declared(rows, "bound_source")
    bounds = "; ".join(f"`{s}` {sources[s]}" for s in order if s in sources)
    parts = [f"Bounds: {bounds}."]
    if any(float(v) == 1 for v in declared(rows, "split_backward").values()):
        parts.append(_prose("split_backward"))
    for p, group in rows.groupby("stages"):
        cells = [
            f"{format_percent(r.util_replayed)} / {format_percent(r.util_wall)} / "
            f"{format_percent(r.util_theory)}"
            for r in group.itertuples()
        ]
        shown = group.assign(cell=cells).pivot(
            index="schedule", columns="microbatches", values="cell"
        )
        shown = shown.reindex(schedule_order(group)).fillna("—")
        shown.columns = [f"M={int(m)}" for m in shown.columns]
        crowded = f" ({p} ranks on {int(ctx.cores)} cores)" if ctx.crowded(p) else ""
        parts.append(f"### P = {int(p)}{crowded}\n\n{markdown_table(shown.reset_index())}")
    parts.append(ctx.plot(plots.utilization(rows, order), "utilization_vs_m", "utilization_vs_m"))
    _against_bounds(ctx, rows, order)
    _rises_with_m(ctx, rows, order)
    return "\n\n".join(parts)


def _against_bounds(ctx: Context, rows: pd.DataFrame, order: list[str]) -> None:
    """Per schedule: the index figure of replayed − bound, and whether it reaches it."""
    sources, labels = declared(rows, "bound_source"), declared(rows, "schedule_label")
    for schedule in order:
        one = rows[rows["schedule"] == schedule]
        gap = (one["util_replayed"] - one["util_theory"]).dropna()
        if schedule not in sources or gap.empty:
            continue
        far = gap.abs().idxmax()
        formula, source = str(sources[schedule]).split(" — ", 1)
        name = labels.get(schedule, schedule)
        where = f"{points(gap[far], 0)} ({ctx.key(one.loc[far])})"
        ctx.figure(
            f"{name} replayed utilization − its bubble bound, every cell",
            theory=f"0 pts (bound {formula})",
            source=source,
            measured=f"median {points(gap.median(), 0)} over {len(gap)} cells; farthest {where}",
        )
        # A cell with a bound but no measured value does not reach it either.
        near = (gap.abs() <= NEAR_BOUND).all() and len(gap) == one["util_theory"].notna().sum()
        claim = _prose("bound_finding", name=name, formula=formula, near=f"{100 * NEAR_BOUND:.0f}")
        ctx.finding(claim, bool(near), f"farthest cell {where}")


def _rises_with_m(ctx: Context, rows: pd.DataFrame, order: list[str]) -> None:
    """The lecture's claim: more micro-batches, higher utilization (every schedule, P)."""
    labels = declared(rows, "schedule_label")
    for schedule in order:
        by_p = rows[rows["schedule"] == schedule].groupby("stages")
        lines = [(p, g.sort_values("microbatches")["util_replayed"]) for p, g in by_p]
        lines = [(p, util) for p, util in lines if len(util) > 1]
        if not lines:
            continue
        falls = [
            f"P={p}: " + ", ".join(map(format_percent, util))
            for p, util in lines
            if not (util.diff().dropna() > 0).all()
        ]
        claim = _prose("rises_finding", name=labels.get(schedule, schedule))
        ctx.finding(claim, not falls, "; ".join(falls))


def memory(ctx: Context) -> str | None:
    """Activation memory per rank

    Peak bytes autograd saved for the backward on the busiest rank (exact accounting via
    `saved_tensors_hooks`), and the most micro-batches whose activations a rank held at
    once, measured by the executor beside the count read off the plan. GPipe runs every
    forward before any backward, so it holds all M; 1F1B (PipeDream-Flush, Narayanan et al.
    2021) starts backwards after P−r forwards on rank r and holds at most P, whatever M is —
    the same bubble as GPipe for a fraction of the memory. With virtual stages a held
    micro-batch counts once per chunk (each 1/V of the rank's layers)."""
    rows = distbench_rows(ctx.ok)
    if rows.empty:
        return None
    table = rows.sort_values(["stages", "microbatches"])[
        [
            "schedule",
            "stages",
            "microbatches",
            "peak_activation_bytes",
            "max_inflight_microbatches",
            "max_inflight_plan",
        ]
    ].copy()
    table["peak_activation_bytes"] = table["peak_activation_bytes"].map(format_bytes)
    holds = _inflight(ctx, rows)
    verdict = (
        "; ".join(f"{name}: {'holds' if ok else '**violated**'}" for name, ok in holds.items())
        or "no 1F1B/GPipe cells"
    )
    plot = ctx.plot(
        plots.memory(rows, schedule_order(rows)), "activation_memory", "activation_memory"
    )
    return f"Checks (measured): {verdict}.\n\n{markdown_table(table)}\n\n{plot}"


def _finite_int(value: Any) -> int | None:
    return int(value) if value is not None and math.isfinite(float(value)) else None


def _inflight(ctx: Context, rows: pd.DataFrame) -> dict[str, bool]:
    """1F1B holds ≤ P micro-batches, GPipe all M: checked, put in the index and headline."""
    inflight = rows["max_inflight_microbatches"]
    one_f = rows[rows["schedule"] == "1f1b"]
    gpipe = rows[rows["schedule"] == "gpipe"]
    holds, most = {}, None
    if not one_f.empty:
        holds["1F1B in-flight ≤ P"] = bool((inflight[one_f.index] <= one_f["stages"]).all())
        most = _finite_int(inflight[one_f.index].max())
        p, m = int(one_f["stages"].max()), int(one_f["microbatches"].max())
        ctx.figure(
            f"1F1B micro-batches in flight (max over ranks and M ≤ {m}, P = {p})",
            theory=f"≤ P = {p}",
            source="Narayanan et al. 2021 (PipeDream-Flush)",
            measured=str(most) if most is not None else "not measured",
            gap="within" if holds["1F1B in-flight ≤ P"] else "exceeds",
        )
    if not gpipe.empty:
        ok = bool((inflight[gpipe.index] == gpipe["microbatches"]).all())
        holds["GPipe in-flight = M"] = ok
        ctx.figure(
            "GPipe micro-batches in flight",
            theory="= M",
            source="GPipe paper, §2.3",
            measured="= M in every cell" if ok else "≠ M in some cell",
            gap="match" if ok else "mismatch",
        )
    for claim, ok in holds.items():
        ctx.finding(claim, ok)
    ctx.headline["inflight_checks"] = holds
    ctx.headline["one_f_one_b_max_inflight"] = most
    return holds


def zero_bubble(ctx: Context) -> str | None:
    """ZB-H1 against 1F1B

    Qi et al. 2024 split each backward into I (the input's gradient) and W (the weights')
    and defer W into the bubble, so ZB-H1 should finish a step sooner than 1F1B at the same
    P and M ≥ P. Compared on the replayed step (each rank its own device, each action its
    measured cost): each ZB-H1 cell profiles a 1F1B twin (same P, M, model and ranks) in
    steps alternating with its own, so the ratio is measured in one cell ("paired"); a row
    without a twin is compared with the 1F1B cell ("separate cells"). The wall clocks of
    the two cells stand beside it. I + W costs about one B here (the next section measures
    it per stage), so what the schedule saves in bubble is not lost in work. ZB-H2 and
    ZB-V, where the run has them, stand beside it (their cells, against ZB-H1's)."""
    rows = distbench_rows(ctx.ok)
    columns = ["stages", "microbatches", "replayed_makespan_s", "step_time_s"]
    if rows.empty or not set(columns) <= set(rows.columns) or "replayed_vs_1f1b" not in rows:
        return None
    zb = rows[
        (rows["schedule"] == "zero_bubble_h1")
        & (rows["microbatches"] >= rows["stages"])
        & rows["replayed_vs_1f1b"].notna()
    ]
    if zb.empty:
        return None
    fused = rows[rows["schedule"] == "1f1b"][["stages", "microbatches", "step_time_s"]]
    both = zb[[*columns, "replayed_vs_1f1b", "vs_1f1b_basis"]].merge(
        fused, on=["stages", "microbatches"], how="left", suffixes=("_zb", "_1f1b")
    )
    sooner = both["replayed_vs_1f1b"] < 1.0
    late = [
        f"P={r.stages}, M={r.microbatches} ({r.replayed_vs_1f1b:.3f}×)"
        for r in both[~sooner].itertuples()
    ]
    ctx.finding(
        _prose("h1_finding"),
        bool(sooner.all()),
        f"not sooner in {len(late)} of {len(both)} cells ({'; '.join(late)})",
    )
    shown = both.rename(
        columns={
            "replayed_makespan_s": "ZB-H1 replayed",
            "replayed_vs_1f1b": "ZB-H1 ÷ 1F1B replayed",
            "vs_1f1b_basis": "1F1B side",
            "step_time_s_zb": "ZB-H1 wall clock",
            "step_time_s_1f1b": "1F1B wall clock (its cell)",
        }
    )
    for other, label in (("zero_bubble_h2", "ZB-H2"), ("zero_bubble_v", "ZB-V")):
        mine = rows[rows["schedule"] == other]
        extra = mine[["stages", "microbatches", "replayed_makespan_s"]]
        _beats_h1(
            ctx,
            both.rename(columns={"replayed_makespan_s": "replayed_makespan_s_zb"}),
            mine.reindex(columns=[*extra.columns, "util_theory"]),
            label,
        )
        shown = shown.merge(
            extra.rename(columns={"replayed_makespan_s": f"{label} replayed"}),
            on=["stages", "microbatches"],
            how="left",
        )
    for column in shown.columns[2:]:
        if column == "ZB-H1 ÷ 1F1B replayed":
            shown[column] = shown[column].map(lambda x: f"{x:.3f}×")
        elif column != "1F1B side":
            shown[column] = shown[column].map(format_seconds)
    return markdown_table(shown)


def _beats_h1(ctx: Context, both: pd.DataFrame, other: pd.DataFrame, label: str) -> None:
    """A finding: `label` (ZB-H2 or ZB-V) replays sooner than ZB-H1 in every cell both ran
    where its bound holds (`util_theory` finite: ZB-H2's assumes M ≥ 2P − 1), as their
    bounds say with the paper's equal costs; the stage-cost section beside shows the
    measured T_F, T_I, T_W that the orders were built without."""
    keys = ["stages", "microbatches"]
    pair = both[[*keys, "replayed_makespan_s_zb"]].merge(other, on=keys)
    bounded = pd.to_numeric(pair["util_theory"], errors="coerce").notna()
    outside, pair = int((~bounded).sum()), pair[bounded]
    if pair.empty:
        return
    sooner = pair["replayed_makespan_s"] < pair["replayed_makespan_s_zb"]
    late = [
        f"P={r.stages}, M={r.microbatches} "
        f"({r.replayed_makespan_s / r.replayed_makespan_s_zb:.2f}×)"
        for r in pair[~sooner].itertuples()
    ]
    detail = _prose(
        "beats_h1_late", late=len(late), cells=len(pair), listing="; ".join(late), outside=outside
    )
    ctx.finding(_prose("beats_h1_finding", label=label), bool(sooner.all()), detail)


def stage_costs(ctx: Context) -> str | None:
    """Measured F, B, I, W per stage beside the paper's relations

    Each cost is the fastest of its stage's actions of that kind (thread CPU time, the
    profiling steps) at the largest M ZB-H1 ran: F, I and W from the ZB-H1 cell, B (and
    1F1B's F, "F fused") from its 1F1B twin profiled in alternating steps in that cell (or,
    without a twin, from the 1F1B cell of the same P and M). Qi et al. 2024 assume
    T_F = T_I = T_W and I + W = B (their B is our I): the last columns show how far the
    measured costs sit from that."""
    rows = distbench_rows(ctx.ok)
    if rows.empty or "stage_costs" not in rows.columns:
        return None
    tables = []
    for p, group in rows.groupby("stages"):
        split = group[(group["schedule"] == "zero_bubble_h1") & group["stage_costs"].notna()]
        fused_cells = group[(group["schedule"] == "1f1b") & group["stage_costs"].notna()]
        fused_by_m = dict(zip(fused_cells["microbatches"], fused_cells["stage_costs"], strict=True))
        if "twin_1f1b_stage_costs" in split.columns:
            for m, twin in zip(split["microbatches"], split["twin_1f1b_stage_costs"], strict=True):
                if isinstance(twin, str) and twin:
                    fused_by_m[m] = twin
        ms = sorted(set(fused_by_m) & set(split["microbatches"]))
        if not ms:
            continue
        m = ms[-1]
        b_costs = json.loads(fused_by_m[m])
        iw_costs = json.loads(split[split["microbatches"] == m]["stage_costs"].iloc[0])
        table, ratios = [], []
        for stage in sorted(b_costs, key=int):
            f_fused, b = b_costs[stage].get("F"), b_costs[stage].get("B")
            own = iw_costs.get(stage, {})
            f, i, w = own.get("F"), own.get("I"), own.get("W")
            if None in (f_fused, f, b, i, w):
                continue
            ratios.append((i + w) / b)
            table.append(
                {
                    "stage": int(stage),
                    "F fused": format_seconds(f_fused),
                    "F": format_seconds(f),
                    "B": format_seconds(b),
                    "I": format_seconds(i),
                    "W": format_seconds(w),
                    "(I+W)/B": f"{(i + w) / b:.2f}",
                    "I/F": f"{i / f:.2f}",
                    "W/F": f"{w / f:.2f}",
                }
            )
        if table:
            tables.append(f"P = {p}, M = {m}:\n\n" + markdown_table(pd.DataFrame(table)))
            ctx.headline.setdefault("split_backward_ratio", {})[f"P={p}"] = max(ratios)
    return "\n\n".join(tables) if tables else None


def _spans(ctx: Context, cell: pd.Series) -> pd.DataFrame | None:
    name = cell.get("spans_file")
    if not isinstance(name, str) or not name:
        return None
    path = ctx.report_dir / name
    return pd.read_csv(path) if path.exists() else None


def gantt(ctx: Context) -> str | None:
    """Gantt charts: naive vs GPipe

    One measured step of each, as the lecture draws it: one row per rank, replayed on the
    left, wall clock on the right. naive at M = 1 and GPipe at M = 4 (else its smallest
    traced M > 1), at P = 4 where the run has it."""
    rows = distbench_rows(ctx.ok)
    if rows.empty:
        return None
    stages = sorted(int(p) for p in rows["stages"].unique())
    p = 4 if 4 in stages else stages[-1]
    found = []
    for schedule in ("naive", "gpipe"):
        traced = rows[(rows["schedule"] == schedule) & (rows["stages"] == p)]
        if schedule == "gpipe":
            preferred = traced[traced["microbatches"] == 4]
            traced = preferred if not preferred.empty else traced[traced["microbatches"] > 1]
        for _, cell in traced.sort_values("microbatches").iterrows():
            spans = _spans(ctx, cell)
            if spans is not None:
                found.append((f"{schedule}, P={p}, M={cell['microbatches']}", cell, spans))
                break
    if not found:
        return "No traced naive/GPipe cell in this run (see `trace_microbatches`)."
    return ctx.plot(plots.gantt(found), "gantt_naive_vs_gpipe", "gantt_naive_vs_gpipe")
