"""Report for `delayed_averaging`: time to a target accuracy against link latency, for
synchronous data parallelism and Delayed Gradient Averaging (Zhu et al., NeurIPS 2021).

Every number is read from results.csv: training wall-clock to the first held-out
evaluation at or above the target (evaluation time excluded), the time the ranks waited
for averages, and the simulated link's seconds. The only theory is labelled: a
synchronous step pays at least one link latency per all-reduce, so its time grows by
steps × latency; DGA hides the latency once D steps of compute cover it.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pandas as pd

from bench.reports import (
    failed_cells_markdown,
    failures_list,
    figure_row,
    format_ratio,
    format_seconds,
    markdown_table,
    new_figure,
    ok_rows,
    run_context,
    save_figure,
    to_jsonable,
    write_headline,
    write_text_atomic,
)

__all__ = ["write_report"]

SOURCE = "Zhu et al. 2021 (DGA, NeurIPS): stale averages applied D steps late hide latency"


def _label(method: str, delay: int) -> str:
    return "sync DP" if method == "sync" else f"DGA, D = {int(delay)}"


def _rows(ok: pd.DataFrame) -> pd.DataFrame:
    ok = ok.assign(label=[_label(m, d) for m, d in zip(ok["method"], ok["delay"], strict=True)])
    sync = ok[ok["method"] == "sync"].set_index("latency_ms")
    ok["sync_time_to_target_s"] = ok["latency_ms"].map(sync["time_to_target_s"]) if len(sync) \
        else math.nan  # fmt: skip
    ok["speedup_vs_sync"] = ok["sync_time_to_target_s"] / ok["time_to_target_s"]
    return ok.sort_values(["latency_ms", "method", "delay"], ascending=[True, False, True])


def _plot_time_to_target(rows: pd.DataFrame, path: Path, target: float) -> None:
    fig, (ax,) = new_figure(7.5, 4.8)
    for i, (label, group) in enumerate(rows.groupby("label", sort=False)):
        group = group.sort_values("latency_ms")
        ax.plot(group["latency_ms"], group["time_to_target_s"], marker="osD^v"[i % 5],
                color=f"C{i % 10}", label=label)  # fmt: skip
    ax.set(xlabel="simulated link latency per round (ms)",
           ylabel=f"training time to {100 * target:.0f}% held-out accuracy (s)",
           title="Time to accuracy against latency")  # fmt: skip
    ax.legend()
    save_figure(fig, path)


def _plot_curves(rows: pd.DataFrame, path: Path, target: float) -> None:
    latency = float(rows["latency_ms"].max())
    fig, (ax,) = new_figure(7.5, 4.8)
    for i, row in enumerate(rows[rows["latency_ms"] == latency].itertuples()):
        curve = json.loads(row.eval_curve) if isinstance(row.eval_curve, str) else row.eval_curve
        ax.plot([c[1] for c in curve], [100 * c[3] for c in curve], marker=".",
                color=f"C{i % 10}", label=row.label)  # fmt: skip
    ax.axhline(100 * target, color="grey", linestyle="--", label="target")
    ax.set(xscale="log", xlabel="training wall-clock (s, log)", ylabel="held-out accuracy (%)",
           title=f"Accuracy against wall-clock at {latency:g} ms latency")  # fmt: skip
    ax.set_ylim(max(0.0, 100 * float(rows["final_accuracy"].min()) - 25), 100)
    ax.legend()
    save_figure(fig, path)


def write_report(df: pd.DataFrame, report_dir: Path) -> dict[str, Any]:
    """Write report.md, time_to_accuracy.png, curves.png and headline.json."""
    report_dir = Path(report_dir)
    report_dir.mkdir(parents=True, exist_ok=True)
    ok = ok_rows(df)
    failures = failures_list(df, ["method", "delay", "latency_ms"])
    parts = ["# Delayed gradient averaging: time to accuracy against link latency\n"]
    best: dict[str, Any] = {}
    figures = []
    if ok.empty:
        parts.append("No cell finished; nothing was measured.\n")
    else:
        rows = _rows(ok)
        first = rows.iloc[0]
        target = float(first["target_accuracy"])
        bandwidth = float(first["bandwidth_mbps"])
        link = "unlimited bandwidth" if not math.isfinite(bandwidth) else f"{bandwidth:g} Mbit/s"
        parts.append(
            "## What was measured, on what\n\n"
            f"Task `{first['task']}` on {int(first['world_size'])} ranks, {int(first['steps'])} "
            f"plain-SGD steps (global batch {int(first['batch_size'])}, peak lr "
            f"{float(first['lr']):g}, cosine decay), gradients all-reduced in one round "
            "(the latency-optimal \"parallel\" algorithm) over a simulated link of the "
            f"latency shown and {link}. Sync DP (`AllReduceDP`) waits for every all-reduce; "
            "DGA (`DelayedAveragingDP`) steps with its local gradient and swaps in the "
            "average D steps later (w ← w − lr·g_t − lr·(ḡ_{t−D} − g_{t−D})), the "
            "averages in flight on a communication thread. Time is training wall-clock, "
            "evaluation excluded; DGA's last D corrections are applied and their wait "
            f"counted before the final evaluation. {run_context(df)}\n"
        )
        _plot_time_to_target(rows, report_dir / "time_to_accuracy.png", target)
        _plot_curves(rows, report_dir / "curves.png", target)
        table = pd.DataFrame({
            "latency": rows["latency_ms"].map(lambda v: f"{v:g} ms"),
            "method": rows["label"],
            f"time to {100 * target:.0f}%": rows["time_to_target_s"].map(format_seconds),
            "vs sync": rows["speedup_vs_sync"].map(format_ratio),
            "steps to target": rows["steps_to_target"].map(
                lambda v: "not reached" if not math.isfinite(v) else f"{int(v)}"),
            "final accuracy": rows["final_accuracy"].map(lambda v: f"{100 * v:.2f}%"),
            "train time": rows["train_time_s"].map(format_seconds),
            "waited for averages": rows["waited_s"].map(format_seconds),
            "simulated link": rows["simulated_s"].map(format_seconds),
        })  # fmt: skip
        parts.append(
            "## Time to accuracy\n\n![time to accuracy](time_to_accuracy.png)\n\n"
            "![accuracy against wall-clock](curves.png)\n\n"
            "`vs sync`: sync DP's time to the target at the same latency over this row's. "
            "`waited for averages`: the exposed communication (sync DP waits the whole "
            "link time inside each step; for DGA, the part of the in-flight latency its D "
            f"steps of compute did not cover).\n\n{markdown_table(table, numparse=False)}\n"
        )
        top = float(rows["latency_ms"].max())
        at_top = rows[rows["latency_ms"] == top]
        sync = at_top[at_top["method"] == "sync"]
        dga = at_top[(at_top["method"] == "dga") & at_top["time_to_target_s"].notna()]
        if len(sync) and len(dga):
            fastest = dga.sort_values("time_to_target_s").iloc[0]
            s = float(sync.iloc[0]["time_to_target_s"])
            d = float(fastest["time_to_target_s"])
            best = {"latency_ms": top, "sync_s": s, "dga_s": d, "delay": int(fastest["delay"]),
                    "speedup": s / d if math.isfinite(s) else math.nan,
                    "dga_final_accuracy": float(fastest["final_accuracy"]),
                    "sync_final_accuracy": float(sync.iloc[0]["final_accuracy"])}  # fmt: skip
            verdict = ("sooner than" if (not math.isfinite(s) or d < s) else "**not sooner** than")
            parts.append(
                f"At {top:g} ms, DGA with D = {best['delay']} reached {100 * target:.0f}% in "
                f"{format_seconds(d)}, {verdict} sync DP's {format_seconds(s)} "
                f"({format_ratio(best['speedup'])}); final accuracy "
                f"{100 * best['dga_final_accuracy']:.2f}% against "
                f"{100 * best['sync_final_accuracy']:.2f}%.\n"
            )
            figures.append(figure_row(
                f"time to {100 * target:.0f}% accuracy at {top:g} ms latency: sync DP ÷ DGA "
                f"(D = {best['delay']})", "> 1×", SOURCE, format_ratio(best["speedup"]),
                f"{format_seconds(s)} vs {format_seconds(d)}"))  # fmt: skip
            figures.append(figure_row(
                f"final accuracy at {top:g} ms, DGA − sync DP (points)", "≈ 0", SOURCE,
                f"{100 * (best['dga_final_accuracy'] - best['sync_final_accuracy']):+.2f}",
                "—"))  # fmt: skip
    figures.append(figure_row("failed cells", "0", "grid", str(len(failures)),
                              f"{len(failures):+d}"))  # fmt: skip
    parts.append(failed_cells_markdown(failures))
    write_text_atomic(report_dir / "report.md", "\n".join(parts))
    headline = {"experiment": "delayed_averaging", "at_largest_latency": best,
                "failed_cells": len(failures), "failures": failures, "figures": figures}
    write_headline(report_dir, headline)
    return to_jsonable(headline)
