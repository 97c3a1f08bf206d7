"""Experiment `gradient_compression`: data-parallel training on real data with every
gradient-compression method of the lecture, bytes on the wire counted, beside torch's
own DDP comm hooks.

A cell is (method, setting, seed): `bench.compression_cells` trains the task on
`world_size` ranks for `steps` SGD steps and records per step the loss, the bytes the
busiest rank sent, the exchange time and the simulated link's time, and the held-out
accuracy every `eval_every` steps. Settings come from the key the method takes: `ratios`
(densities for topk, topk_noef, randomk, dgc), `ranks` (powersgd, torch_powersgd),
`levels` (qsgd); the other methods have one cell per seed.

Each row's `baseline_accuracy` is the `dp` cell's of the same seed, and
`compression_ratio` its measured bytes per step over this row's — both measured in this
run (NaN where the grid has no `dp` cell, or the row is torch's, whose bytes our counters
cannot see).
"""

from __future__ import annotations

import json
import math
import statistics
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from bench.compression_cells import (
    METHODS,
    SETTING_KEY,
    SETTING_NAME,
    CompressionCell,
    run_compression_cell,
)
from bench.experiments.common import (
    Cell,
    Experiment,
    check_batch_split,
    check_choices,
    check_positive,
    check_training,
)
from bench.kit.tasks import DEFAULT_BATCH, DEFAULT_LR, TASKS
from bench.reports import gradient_compression as report
from bench.reports import write_text_atomic
from impls.comm import SimulatedNetwork
from impls.compression import check_density, check_levels, check_rank

__all__ = ["EXPERIMENT", "GradientCompressionConfig", "cells", "to_row"]


@dataclass(kw_only=True)
class GradientCompressionConfig:
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """Any of: dp, topk, topk_noef, randomk, dgc, onebit, terngrad, qsgd, powersgd, fp16,
    bf16, torch_powersgd, torch_fp16."""
    ratios: list[float] = field(default_factory=lambda: [0.01, 0.1])
    """Densities kept by topk, topk_noef, randomk and dgc, each in (0, 1]."""
    ranks: list[int] = field(default_factory=lambda: [1, 4])
    """PowerSGD ranks (distbench's and torch's hook), each ≥ 1."""
    levels: list[int] = field(default_factory=lambda: [4])
    """QSGD quantization levels s, each in [1, 127]."""
    network: dict[str, float] | None = None
    """Simulated link for distbench's exchanges: {latency_ms, bandwidth_mbps}; null: off."""
    task: str = "digits"
    """digits (sklearn's 8×8 digits, MLP) or chargpt (character GPT on Python's docs)."""
    steps: int = 300
    batch_size: int | None = None
    """Global batch per step (split over the ranks); null: the task's default."""
    lr: float | None = None
    """Peak SGD learning rate (cosine decay to 0); null: the task's default."""
    world_size: int = 4
    seeds: list[int] = field(default_factory=lambda: [0])
    """Each seed is a full replicate (model init and data order)."""
    eval_every: int = 50
    dgc_warmup_steps: int = 50
    """DGC's sparsity warm-up: density decays from 25% to the target over these steps."""
    draws: int = 200
    """Quantizations drawn for QSGD's and TernGrad's unbiasedness and variance check."""
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_choices("task", [self.task], TASKS)
        for ratio in self.ratios:
            check_density(ratio)
        for rank in self.ranks:
            try:
                check_rank(rank)
            except ValueError as err:
                raise ValueError(f"ranks={self.ranks}: {err}") from err
        for level in self.levels:
            try:
                check_levels(level)
            except ValueError as err:
                raise ValueError(f"levels={self.levels}: {err}") from err
        for key in ("ratios", "ranks", "levels"):
            used = [m for m in self.methods if SETTING_KEY[m] == key]
            if used and not getattr(self, key):
                raise ValueError(f"{key}=[] but methods {used} need at least one value")
        if self.network is not None:
            unknown = set(self.network) - {"latency_ms", "bandwidth_mbps"}
            if unknown:
                raise ValueError(f"network has unknown key(s) {sorted(unknown)}; allowed: "
                                 "latency_ms, bandwidth_mbps")  # fmt: skip
            SimulatedNetwork.from_units(**self.network)
        check_positive("draws", [self.draws], minimum=2)
        check_positive("dgc_warmup_steps", [self.dgc_warmup_steps], minimum=0)
        check_positive("seeds", self.seeds, minimum=0)
        if self.batch_size is None:
            self.batch_size = DEFAULT_BATCH[self.task]
        if self.lr is None:
            self.lr = DEFAULT_LR[self.task]
        check_training(self, ("steps", "world_size", "eval_every", "batch_size"))
        check_batch_split(self.batch_size, self.world_size)


def _settings(cfg: GradientCompressionConfig, method: str) -> list[Any]:
    key = SETTING_KEY[method]
    return [None] if key is None else list(getattr(cfg, key))


def setting_label(method: str, setting: Any) -> str:
    key = SETTING_KEY[method]
    return "" if key is None else f"{SETTING_NAME[key]}={setting:g}"


def cells(cfg: GradientCompressionConfig) -> list[Cell]:
    out = []
    for seed in cfg.seeds:
        for method in cfg.methods:
            for setting in _settings(cfg, method):
                task = CompressionCell(
                    method=method, setting=setting, task=cfg.task, steps=cfg.steps,
                    batch_size=cfg.batch_size, lr=cfg.lr, seed=seed, eval_every=cfg.eval_every,
                    network=dict(cfg.network) if cfg.network else None,
                    dgc_warmup_steps=cfg.dgc_warmup_steps, draws=cfg.draws,
                )  # fmt: skip
                key = {"method": method, "setting": setting_label(method, setting), "seed": seed}
                out.append(Cell(world_size=cfg.world_size, key=key, fn=run_compression_cell,
                                task=task))  # fmt: skip
    return out


def _median(values: list[float]) -> float:
    return statistics.median(values) if values else math.nan


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: CompressionCell = cell.task
    first = per_rank[0]
    steps = len(first["losses"])
    torch_row = task.method.startswith("torch_")
    # The busiest rank's bytes per step (the all-gather and ring send alike on every rank).
    bytes_per_step = math.nan if torch_row else max(_median(r["bytes_sent"]) for r in per_rank)
    step_time = [max(r["step_times_s"][i] for r in per_rank) for i in range(steps)]
    sync_time = [max(r["sync_times_s"][i] for r in per_rank) for i in range(steps)]
    simulated = [max(r["simulated_s"][i] for r in per_rank) for i in range(steps)]
    losses = [statistics.fmean(r["losses"][i] for r in per_rank) for i in range(steps)]
    row: dict[str, Any] = {
        **cell.key,
        "impl": "torch" if torch_row else "distbench",
        "task": task.task,
        "world_size": cell.world_size,
        "params": first["params"],
        "steps": steps,
        "batch_size": task.batch_size,
        "lr": task.lr,
        "latency_ms": (task.network or {}).get("latency_ms", 0.0),
        "bandwidth_mbps": (task.network or {}).get("bandwidth_mbps", math.inf),
        "bytes_per_step": bytes_per_step,
        "rounds_per_step": math.nan if torch_row else _median(first["rounds"]),
        "dense_grad_bytes": 4 * first["params"],
        "step_time_s": _median(step_time),
        "comm_time_s": math.nan if torch_row else _median(sync_time),
        "simulated_s": _median(simulated),
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
    for name in ("bias_stat", "relative_bias", "variance", "variance_bound",
                 "variance_expected", "draws", "numel"):  # fmt: skip
        row[f"quant_{name}"] = quantizer.get(name, math.nan)
    return row


def add_baseline(df: pd.DataFrame) -> pd.DataFrame:
    """`baseline_accuracy`, `baseline_bytes_per_step` and `compression_ratio` from the
    `dp` row of the same seed (NaN without one)."""
    df = df.copy()
    ok = df[(df["method"] == "dp") & (df.get("status", "ok") == "ok")]
    by_seed = ok.set_index("seed")
    df["baseline_accuracy"] = df["seed"].map(by_seed["final_accuracy"]) if len(ok) else math.nan
    base_bytes = df["seed"].map(by_seed["bytes_per_step"]) if len(ok) else math.nan
    df["baseline_bytes_per_step"] = base_bytes
    df["compression_ratio"] = base_bytes / df["bytes_per_step"]
    return df


def _write_report(df: pd.DataFrame, report_dir) -> dict:
    """Add the baseline columns (derived from the dp rows of this run), keep them in
    results.csv too, and write the report."""
    if "final_accuracy" in df:
        df = add_baseline(df)
        path = Path(report_dir) / "results.csv"
        if path.exists():
            write_text_atomic(path, df.to_csv(index=False))
    return report.write_report(df, report_dir)


EXPERIMENT = Experiment(
    name="gradient_compression",
    schema=GradientCompressionConfig,
    key_columns=["method", "setting", "seed"],
    cells=cells,
    to_row=to_row,
    write_report=_write_report,
)
