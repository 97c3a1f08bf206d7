"""`delayed_averaging`: time to a target accuracy against link latency, for synchronous
data parallelism and Delayed Gradient Averaging (Zhu et al., NeurIPS 2021).

A cell is (method, delay, latency_ms): `ranks.run` trains the task on `world_size` ranks
under the simulated link the cell carries (`ranks.Link`: that latency, and
`bandwidth_mbps`, default unlimited: the latency-bound regime DGA targets) and records
held-out accuracy against training wall-clock. `sync` runs once per latency; `dga` once
per (delay, latency).
"""

from __future__ import annotations

import json
import math

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.delayed_averaging import report
from bench.experiments.delayed_averaging.config import DelayedAveragingConfig
from bench.experiments.delayed_averaging.ranks import Link, run

__all__ = ["EXPERIMENT", "DelayedAveragingConfig", "cells", "to_row"]


def cells(cfg: DelayedAveragingConfig) -> list[Cell]:
    """Per latency: sync DP once, DGA once per delay; each cell carries its link."""
    return [
        Cell(
            world_size=cfg.world_size,
            fn=run,
            carry=Link(float(latency), cfg.bandwidth_mbps),
            key={"method": method, "delay": delay, "latency_ms": float(latency)},
        )
        for latency in cfg.latencies_ms
        for method in cfg.methods
        for delay in ([0] if method == "sync" else cfg.delays)
    ]


def _first(evals: list, target: float, index: int) -> float:
    """Item `index` of the first evaluation at or above `target` (NaN if none)."""
    return next((e[index] for e in evals if e[3] >= target), math.nan)


def to_row(cfg: DelayedAveragingConfig, cell: Cell, per_rank: list[dict]) -> dict:
    evals = per_rank[0]["evals"]  # (step, train seconds, held-out loss, accuracy), rank 0
    bandwidth = cell.carry.bandwidth_mbps
    return {
        **cell.key,
        "task": cfg.task,
        "world_size": cell.world_size,
        "bandwidth_mbps": bandwidth if bandwidth is not None else math.inf,
        "steps": cfg.steps,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "train_time_s": max(r["train_time_s"] for r in per_rank),
        "waited_s": max(r["waited_s"] for r in per_rank),
        "simulated_s": max(r["simulated_s"] for r in per_rank),
        "target_accuracy": cfg.target_accuracy,
        "time_to_target_s": _first(evals, cfg.target_accuracy, 1),
        "steps_to_target": _first(evals, cfg.target_accuracy, 0),
        "final_loss": evals[-1][2],
        "final_accuracy": evals[-1][3],
        # [[step, train seconds, held-out loss, held-out accuracy]] of rank 0
        "eval_curve": json.dumps(
            [[s, round(t, 4), round(lo, 5), round(a, 5)] for s, t, lo, a in evals]
        ),
    }


EXPERIMENT = Experiment(
    name="delayed_averaging",
    summary="time to accuracy against link latency: sync DP vs delayed gradient averaging",
    schema=DelayedAveragingConfig,
    key_columns=("method", "delay", "latency_ms"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Time to target accuracy against link latency",
            x="latency_ms",
            y="time_to_target_s",
            group="delay",
            kind="scatter",
        ),
        Chart(
            title="Final held-out accuracy against link latency",
            x="latency_ms",
            y="final_accuracy",
            group="delay",
            kind="scatter",
        ),
    ),
)
