"""Experiment `delayed_averaging`: time to a target accuracy against link latency, for
synchronous data parallelism and Delayed Gradient Averaging (Zhu et al., NeurIPS 2021).

A cell is (method, delay, latency_ms): `bench.dga_cells` trains the digits task on
`world_size` ranks under a simulated link of that latency (and `bandwidth_mbps`, default
unlimited: the latency-bound regime DGA targets) and records held-out accuracy against
training wall-clock. `sync` runs once per latency; `dga` once per (delay, latency).
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass, field

from bench.dga_cells import DGACell, run_dga_cell
from bench.experiments.common import (
    Cell,
    Experiment,
    check_batch_split,
    check_choices,
    check_positive,
    check_training,
)
from bench.reports import delayed_averaging as report
from impls.comm import SimulatedNetwork

__all__ = ["EXPERIMENT", "DelayedAveragingConfig", "cells", "to_row"]

METHODS = ("sync", "dga")


@dataclass(kw_only=True)
class DelayedAveragingConfig:
    latencies_ms: list[float] = field(default_factory=lambda: [0.0, 10.0, 50.0, 100.0])
    """One-way link latency per round of the simulated network, each ≥ 0."""
    delays: list[int] = field(default_factory=lambda: [4, 16])
    """DGA's delay D (steps an average may take), each ≥ 1; sync DP is D = 0."""
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    bandwidth_mbps: float | None = None
    """Link bandwidth; null: unlimited (latency only)."""
    target_accuracy: float = 0.95
    """Held-out accuracy whose first crossing is the time-to-accuracy."""
    task: str = "digits"
    steps: int = 300
    batch_size: int = 64
    lr: float = 0.5
    """Peak plain-SGD learning rate (cosine decay to 0)."""
    world_size: int = 4
    eval_every: int = 10
    seed: int = 0
    timeout_s: float = 900.0

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_choices("task", [self.task], ["digits", "chargpt"])
        if not self.latencies_ms:
            raise ValueError("latencies_ms=[]: give at least one latency")
        for latency in self.latencies_ms:
            try:
                SimulatedNetwork.from_units(latency_ms=latency)
            except ValueError as err:
                raise ValueError(f"latencies_ms={self.latencies_ms}: {err}") from err
        if self.bandwidth_mbps is not None:
            SimulatedNetwork.from_units(bandwidth_mbps=self.bandwidth_mbps)
        if "dga" in self.methods:
            check_positive("delays", self.delays)
        if not (isinstance(self.target_accuracy, int | float) and 0 < self.target_accuracy <= 1):
            raise ValueError(f"target_accuracy={self.target_accuracy}: must be in (0, 1]")
        check_training(self, ("steps", "batch_size", "world_size", "eval_every"))
        check_batch_split(self.batch_size, self.world_size)


def cells(cfg: DelayedAveragingConfig) -> list[Cell]:
    out = []
    for latency in cfg.latencies_ms:
        for method in cfg.methods:
            for delay in [0] if method == "sync" else cfg.delays:
                task = DGACell(
                    method=method, delay=delay, latency_ms=float(latency),
                    bandwidth_mbps=cfg.bandwidth_mbps, task=cfg.task, steps=cfg.steps,
                    batch_size=cfg.batch_size, lr=cfg.lr, seed=cfg.seed,
                    eval_every=cfg.eval_every, target_accuracy=cfg.target_accuracy,
                )  # fmt: skip
                key = {"method": method, "delay": delay, "latency_ms": float(latency)}
                out.append(Cell(world_size=cfg.world_size, key=key, fn=run_dga_cell,
                                task=task))  # fmt: skip
    return out


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: DGACell = cell.task
    first = per_rank[0]
    return {
        **cell.key,
        "task": task.task,
        "world_size": cell.world_size,
        "bandwidth_mbps": task.bandwidth_mbps if task.bandwidth_mbps is not None else math.inf,
        "steps": task.steps,
        "batch_size": task.batch_size,
        "lr": task.lr,
        "train_time_s": max(r["train_time_s"] for r in per_rank),
        "waited_s": max(r["waited_s"] for r in per_rank),
        "simulated_s": max(r["simulated_s"] for r in per_rank),
        "target_accuracy": task.target_accuracy,
        "time_to_target_s": next(
            (t for _, t, _, a in first["evals"] if a >= task.target_accuracy), math.nan
        ),  # fmt: skip
        "steps_to_target": next(
            (s for s, _, _, a in first["evals"] if a >= task.target_accuracy), math.nan
        ),  # fmt: skip
        "final_loss": first["evals"][-1][2],
        "final_accuracy": first["evals"][-1][3],
        # [[step, train seconds, held-out loss, held-out accuracy]] of rank 0
        "eval_curve": json.dumps(
            [[s, round(t, 4), round(lo, 5), round(a, 5)] for s, t, lo, a in first["evals"]]
        ),  # fmt: skip
    }


EXPERIMENT = Experiment(
    name="delayed_averaging",
    schema=DelayedAveragingConfig,
    key_columns=["method", "delay", "latency_ms"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
