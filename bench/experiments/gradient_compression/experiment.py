"""`gradient_compression`: data-parallel training on real data with every
gradient-compression method of the lecture, bytes on the wire counted, beside torch's
own DDP comm hooks.

A cell is (method, setting, seed): `ranks.run` trains the task on `world_size` ranks for
`steps` SGD steps and records per step the loss, the bytes each rank sent, the exchange
time and the simulated link's time, and the held-out accuracy every `eval_every` steps.
Settings come from the key the method takes: `ratios` (densities for topk, topk_noef,
randomk, dgc), `ranks` (powersgd, torch_powersgd), `levels` (qsgd); the other methods
have one cell per seed. The cell carries the numeric setting its label names.

Each row's `baseline_accuracy` is the `dp` cell's of the same seed, and
`compression_ratio` its measured bytes per step over this row's — both measured in this
run (NaN where the grid has no `dp` cell, or the row is torch's, whose bytes our counters
cannot see); the report derives them (`report.add_baseline`)."""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.gradient_compression import report
from bench.experiments.gradient_compression.config import (
    SETTING_KEY,
    SETTING_NAME,
    GradientCompressionConfig,
)
from bench.experiments.gradient_compression.ranks import run

__all__ = ["EXPERIMENT", "GradientCompressionConfig", "cells", "setting_label", "to_row"]


def _settings(cfg: GradientCompressionConfig, method: str) -> list[Any]:
    key = SETTING_KEY[method]
    return [None] if key is None else list(getattr(cfg, key))


def setting_label(method: str, setting: Any) -> str:
    """The `setting` key of a row: "density=0.01", "rank=4", "levels=4", or ""."""
    key = SETTING_KEY[method]
    return "" if key is None else f"{SETTING_NAME[key]}={setting:g}"


def cells(cfg: GradientCompressionConfig) -> list[Cell]:
    """Every (seed, method, setting); the cell carries the numeric setting."""
    return [
        Cell(
            world_size=cfg.world_size,
            fn=run,
            carry=setting,
            key={"method": method, "setting": setting_label(method, setting), "seed": seed},
        )
        for seed in cfg.seeds
        for method in cfg.methods
        for setting in _settings(cfg, method)
    ]


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def _per_step(per_rank: list[dict], key: str, reduce=max) -> list[float]:
    """One value per step: `reduce` over the ranks."""
    return [reduce(values) for values in zip(*(r[key] for r in per_rank), strict=True)]


def to_row(cfg: GradientCompressionConfig, cell: Cell, per_rank: list[dict]) -> dict:
    first = per_rank[0]
    steps = len(first["losses"])
    torch_row = cell.key["method"].startswith("torch_")
    network = cfg.network or {}
    losses = _per_step(per_rank, "losses", statistics.fmean)
    step_time = _per_step(per_rank, "step_times_s")  # the slowest rank's already
    row: dict[str, Any] = {
        **cell.key,
        "impl": "torch" if torch_row else "distbench",
        "task": cfg.task,
        "world_size": cell.world_size,
        "params": first["params"],
        "steps": steps,
        "batch_size": cfg.batch_size,
        "lr": cfg.lr,
        "latency_ms": network.get("latency_ms", 0.0),
        "bandwidth_mbps": network.get("bandwidth_mbps", math.inf),
        # The busiest rank's bytes per step (the all-gather and ring send alike on every rank).
        "bytes_per_step": math.nan
        if torch_row
        else max(_median(r["bytes_sent"]) for r in per_rank),
        "rounds_per_step": math.nan if torch_row else _median(first["rounds"]),
        "dense_grad_bytes": 4 * first["params"],
        "step_time_s": _median(step_time),
        "comm_time_s": math.nan if torch_row else _median(_per_step(per_rank, "sync_times_s")),
        "simulated_s": _median(_per_step(per_rank, "simulated_s")),
        "train_time_s": sum(step_time),
        "final_train_loss": statistics.fmean(losses[-max(1, steps // 20) :]),
        "final_loss": first["final_loss"],
        "final_accuracy": first["final_accuracy"],
        # JSON, so results.csv round-trips them: [loss per step], [[step, train s, loss, acc]]
        "loss_curve": json.dumps([round(v, 5) for v in losses]),
        "eval_curve": json.dumps(
            [[s, round(t, 4), round(lo, 5), round(a, 5)] for s, t, lo, a in first["evals"]]
        ),
    }
    quantizer = first.get("quantizer") or {}
    for name in (
        "bias_stat",
        "relative_bias",
        "variance",
        "variance_bound",
        "variance_expected",
        "draws",
        "numel",
    ):
        row[f"quant_{name}"] = quantizer.get(name, math.nan)
    return row


EXPERIMENT = Experiment(
    name="gradient_compression",
    summary="compressed data parallelism on real data: accuracy against counted bytes",
    schema=GradientCompressionConfig,
    key_columns=("method", "setting", "seed"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Final accuracy against bytes on the wire",
            x="bytes_per_step",
            y="final_accuracy",
            group="method",
            kind="scatter",
            log_x=True,
        ),
        Chart(
            title="Compression ratio per method",
            x="method",
            y="compression_ratio",
            kind="bar",
            log_y=True,
        ),
    ),
)
