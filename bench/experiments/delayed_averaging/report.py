"""The `delayed_averaging` report: time to a target accuracy against link latency, for
synchronous data parallelism and Delayed Gradient Averaging (Zhu et al., NeurIPS 2021).

Every number is read from the rows: training wall-clock to the first held-out evaluation
at or above the target (evaluation time excluded), the time the ranks waited for
averages, and the simulated link's seconds. `prepare` derives each row's speed-up over
sync DP at the same latency; the target (DGA sooner than sync DP) is judged on every DGA
cell under a simulated latency. The only theory is labelled: a synchronous step pays at
least one link latency per all-reduce, so its time grows by steps × latency; DGA hides
the latency once D steps of compute cover it.
"""

from __future__ import annotations

import json
import math
from typing import Any

import pandas as pd

from bench.report import (
    Context,
    Report,
    Target,
    format_ratio,
    format_seconds,
    markdown_table,
    new_figure,
    ok_rows,
    prose,
)

__all__ = ["REPORT", "SPEEDUP_TARGET", "prepare"]

SOURCE = "Zhu et al. 2021 (DGA, NeurIPS): stale averages applied D steps late hide latency"

SPEEDUP_TARGET = Target(
    figure="time to the target accuracy: sync DP ÷ DGA, same latency (every delay, every "
    "latency > 0)",
    column="speedup_vs_sync",
    op=">",
    bound=1.0,
    source=SOURCE,
    where={"method": "dga", "under_latency": True},
    wall_clock=True,
)


def _label(method: str, delay: Any) -> str:
    return "sync DP" if method == "sync" else f"DGA, D = {int(delay)}"


def prepare(df: pd.DataFrame) -> pd.DataFrame:
    """`sync_time_to_target_s` (sync DP's at the row's latency), `speedup_vs_sync` (that
    over the row's; a run that never reached the target counts as infinitely slow) and
    `under_latency` (the link had a latency to hide)."""
    df = df.copy()
    needed = {"method", "latency_ms", "time_to_target_s"}
    if not needed <= set(df.columns):
        df["sync_time_to_target_s"] = df["speedup_vs_sync"] = math.nan
        df["under_latency"] = False
        return df
    latency = pd.to_numeric(df["latency_ms"], errors="coerce")
    reached = pd.to_numeric(df["time_to_target_s"], errors="coerce")
    ok = ok_rows(df)
    sync = ok[ok["method"] == "sync"]
    by_latency = pd.Series(reached[sync.index].to_numpy(), index=latency[sync.index])
    df["sync_time_to_target_s"] = latency.map(by_latency) if len(sync) else math.nan
    never = math.inf
    df["speedup_vs_sync"] = df["sync_time_to_target_s"].fillna(never) / reached.fillna(never)
    df["under_latency"] = latency > 0
    return df


def _rows(ok: pd.DataFrame) -> pd.DataFrame:
    labels = [_label(m, d) for m, d in zip(ok["method"], ok["delay"], strict=True)]
    return ok.assign(label=labels).sort_values(
        ["latency_ms", "method", "delay"], ascending=[True, False, True]
    )


def _number(row: pd.Series, column: str) -> float:
    value = pd.to_numeric(row.get(column, math.nan), errors="coerce")
    return float(value) if pd.notna(value) else math.nan


def _count(value: Any) -> str:
    number = pd.to_numeric(value, errors="coerce")
    return "—" if pd.isna(number) else f"{int(number)}"


def what_was_measured(ctx: Context) -> str | None:
    """What was measured, on what

    Gradients are all-reduced in one round (the latency-optimal "parallel" algorithm)
    over a simulated link of the latency shown. Sync DP (`AllReduceDP`) waits for every
    all-reduce; DGA (`DelayedAveragingDP`) steps with its local gradient and swaps in the
    average D steps later (w ← w − lr·g_t − lr·(ḡ_{t−D} − g_{t−D})), the averages in
    flight on a communication thread. Each step is barrier-opened and timed on the
    slowest rank; time is training wall-clock, evaluation excluded; DGA's last D
    corrections are applied and their wait counted before the final evaluation."""
    first = ctx.ok.iloc[0]
    bandwidth = _number(first, "bandwidth_mbps")
    link = "unlimited bandwidth" if not math.isfinite(bandwidth) else f"{bandwidth:g} Mbit/s"
    return prose(
        __package__,
        "setup",
        task=first["task"],
        ranks=_count(first["world_size"]),
        steps=_count(first["steps"]),
        batch=_count(first["batch_size"]),
        lr=f"{_number(first, 'lr'):g}",
        link=link,
    )


def _plot_time_to_target(ctx: Context, rows: pd.DataFrame, target: float) -> str:
    fig, (ax,) = new_figure(7.5, 4.8)
    for i, (label, group) in enumerate(rows.groupby("label", sort=False)):
        group = group.sort_values("latency_ms")
        ax.plot(
            group["latency_ms"],
            group["time_to_target_s"],
            marker="osD^v"[i % 5],
            color=f"C{i % 10}",
            label=label,
        )
    ax.set(
        xlabel="simulated link latency per round (ms)",
        ylabel=f"training time to {100 * target:.0f}% held-out accuracy (s)",
        title="Time to accuracy against latency",
    )
    ax.legend()
    return ctx.plot(fig, "time_to_accuracy", "time to accuracy")


def _plot_curves(ctx: Context, rows: pd.DataFrame, target: float) -> str:
    latency = float(rows["latency_ms"].max())
    fig, (ax,) = new_figure(7.5, 4.8)
    for i, row in enumerate(rows[rows["latency_ms"] == latency].itertuples()):
        curve = json.loads(row.eval_curve) if isinstance(row.eval_curve, str) else []
        ax.plot(
            [c[1] for c in curve],
            [100 * c[3] for c in curve],
            marker=".",
            color=f"C{i % 10}",
            label=row.label,
        )
    ax.axhline(100 * target, color="grey", linestyle="--", label="target")
    times = [
        c[1] for curve in rows["eval_curve"] if isinstance(curve, str) for c in json.loads(curve)
    ]
    ax.set(
        xscale="log" if times and min(times) > 0 else "linear",
        xlabel="training wall-clock (s)",
        ylabel="held-out accuracy (%)",
        title=f"Accuracy against wall-clock at {latency:g} ms latency",
    )
    finals = pd.to_numeric(rows["final_accuracy"], errors="coerce")
    low = 100 * float(finals.min()) - 25 if finals.notna().any() else 0.0
    ax.set_ylim(max(0.0, low), 100)
    ax.legend()
    return ctx.plot(fig, "curves", "accuracy against wall-clock")


def _table(rows: pd.DataFrame, target: float) -> str:
    table = pd.DataFrame(
        {
            "latency": rows["latency_ms"].map(lambda v: f"{v:g} ms"),
            "method": rows["label"],
            f"time to {100 * target:.0f}%": rows["time_to_target_s"].map(format_seconds),
            "vs sync": rows["speedup_vs_sync"].map(format_ratio),
            "steps to target": rows["steps_to_target"].map(
                lambda v: "not reached" if not math.isfinite(v) else f"{int(v)}"
            ),
            "final accuracy": rows["final_accuracy"].map(lambda v: f"{100 * v:.2f}%"),
            "train time": rows["train_time_s"].map(format_seconds),
            "waited for averages": rows["waited_s"].map(format_seconds),
            "simulated link": rows["simulated_s"].map(format_seconds),
        }
    )
    return markdown_table(table, numparse=False)


def _at_largest_latency(ctx: Context, rows: pd.DataFrame, target: float) -> str:
    """The fastest DGA against sync DP at the largest latency: sentence and index rows."""
    top = float(rows["latency_ms"].max())
    at_top = rows[rows["latency_ms"] == top]
    sync = at_top[at_top["method"] == "sync"]
    dga = at_top[(at_top["method"] == "dga") & at_top["time_to_target_s"].notna()]
    if not len(sync) or not len(dga):
        return ""
    fastest = dga.sort_values("time_to_target_s").iloc[0]
    s, d = float(sync.iloc[0]["time_to_target_s"]), float(fastest["time_to_target_s"])
    best = {
        "latency_ms": top,
        "sync_s": s,
        "dga_s": d,
        "delay": int(fastest["delay"]),
        "speedup": s / d if math.isfinite(s) and d > 0 else math.nan,
        "dga_final_accuracy": float(fastest["final_accuracy"]),
        "sync_final_accuracy": float(sync.iloc[0]["final_accuracy"]),
    }
    ctx.headline["at_largest_latency"] = best
    percent = f"{100 * target:.0f}%"
    ctx.figure(
        f"time to {percent} accuracy at {top:g} ms latency: sync DP ÷ fastest DGA "
        f"(D = {best['delay']})",
        theory="> 1×",
        source=SOURCE,
        measured=format_ratio(best["speedup"]),
        gap=f"{format_seconds(s)} vs {format_seconds(d)}",
    )
    points = 100 * (best["dga_final_accuracy"] - best["sync_final_accuracy"])
    ctx.figure(
        f"final accuracy at {top:g} ms, DGA (D = {best['delay']}) − sync DP (points)",
        theory="≈ 0",
        source=SOURCE,
        measured=f"{points:+.2f}",
    )
    return prose(
        __package__,
        "at_largest_latency",
        latency=f"{top:g}",
        delay=best["delay"],
        percent=percent,
        dga=format_seconds(d),
        sync=format_seconds(s),
        speedup=format_ratio(best["speedup"]),
        sooner=not math.isfinite(s) or d < s,
        dga_final=f"{100 * best['dga_final_accuracy']:.2f}%",
        sync_final=f"{100 * best['sync_final_accuracy']:.2f}%",
    )


def _findings(ctx: Context, rows: pd.DataFrame) -> None:
    """DGA against sync DP at the same latency: steps to the target and final accuracy."""
    sync = rows[rows["method"] == "sync"].set_index("latency_ms")
    dga = rows[(rows["method"] == "dga") & rows["latency_ms"].isin(sync.index)]
    if dga.empty:
        return
    base = sync.loc[dga["latency_ms"]]
    steps = dga["steps_to_target"].to_numpy() - base["steps_to_target"].to_numpy()
    points = 100 * (dga["final_accuracy"].to_numpy() - base["final_accuracy"].to_numpy())
    keys = [ctx.key(r) for _, r in dga.iterrows()]
    slower = [f"{k}: {s:+g} steps" for k, s in zip(keys, steps, strict=True) if not s <= 0]
    ctx.finding(
        "DGA reaches the target in no more steps than sync DP (staleness costs no convergence)",
        not slower,
        "; ".join(slower),
    )
    off = [f"{k}: {p:+.2f} points" for k, p in zip(keys, points, strict=True) if not p >= -1]
    ctx.finding(
        "DGA ends within 1 point of sync DP's final accuracy at the same latency",
        not off,
        "; ".join(off),
    )


def time_to_accuracy(ctx: Context) -> str | None:
    """Time to accuracy

    `vs sync`: sync DP's time to the target at the same latency over this row's.
    `waited for averages`: the exposed communication (sync DP waits the whole link time
    inside each step; for DGA, the part of the in-flight latency its D steps of compute
    did not cover)."""
    if ctx.ok.empty:
        return None
    rows = _rows(ctx.ok)
    target = _number(rows.iloc[0], "target_accuracy")
    target = target if math.isfinite(target) else math.nan
    plots = [_plot_time_to_target(ctx, rows, target), _plot_curves(ctx, rows, target)]
    _findings(ctx, rows)
    sentence = _at_largest_latency(ctx, rows, target)
    return "\n\n".join([*plots, _table(rows, target), sentence])


REPORT = Report(
    title="Delayed gradient averaging: time to accuracy against link latency",
    intro=prose(__package__, "intro"),
    sections=(what_was_measured, time_to_accuracy),
    targets=(SPEEDUP_TARGET,),
    prepare=prepare,
)
