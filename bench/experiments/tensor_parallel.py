"""Experiment `tensor_parallel`: Megatron tensor parallelism of the GPT, beside torch's
DTensor `parallelize_module`, at each TP degree t.

A cell is (method, t). Both methods split the same GPT over t ranks (`bench.tp_cells`):
distbench's `parallelize_gpt` and torch's ColwiseParallel / RowwiseParallel plan. Each
cell trains `steps` SGD steps and checks them against one process (`wrong`), counts one
transformer block's communication forward and backward, accounts the rank's memory over
a step of the block stack, and times that step (with `paired`, alternating with the
other method on twin weights, so the speed ratio is measured side by side).

Beside the measured traffic stands Megatron-LM's count (Shoeybi et al., arXiv 1909.08053,
§3): one all-reduce of the (b, s, h) activations after attention and one after the MLP in
forward, the same two in backward; with distbench's ring all-reduce each sends
2(t−1)/t · b·s·h·4 bytes per rank (`impls.tensor_parallel.analytic_comm`).
"""

from __future__ import annotations

import math
import statistics
from dataclasses import dataclass, field
from typing import Any

from bench.experiments.common import (
    Cell,
    Experiment,
    check_choices,
    check_gpt_model,
    check_positive,
    check_training,
)
from bench.reports import tensor_parallel as report
from bench.tp_cells import METHODS, TWIN, TPCell, run_tp_cell
from impls.models import GPTConfig
from impls.tensor_parallel import analytic_comm, check_tp_config

__all__ = ["EXPERIMENT", "TOLERANCE", "TensorParallelConfig", "cells", "to_row"]

# Relative error of the whole model's SGD update against one process, fp32: the same
# arithmetic summed in another order (5.7e-7 measured at t = 2 on the CI model).
TOLERANCE = 1e-4


@dataclass(kw_only=True)
class TensorParallelConfig:
    tp_degrees: list[int] = field(default_factory=lambda: [1, 2, 4])
    """Tensor-parallel degrees t; each must divide the model's n_heads, d_ff and vocab."""
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """distbench (Megatron layers) and/or torch_dtensor (`parallelize_module`)."""
    model: dict[str, Any] = field(
        default_factory=lambda: {
            "d_model": 128, "n_layers": 4, "n_heads": 8, "seq_len": 64, "vocab_size": 256,
            "bias": False,
        }
    )  # fmt: skip
    """`GPTConfig` keyword arguments of the model every cell splits."""
    batch_size: int = 8
    """Sequences per step; every TP rank sees the whole batch."""
    steps: int = 3
    """SGD steps checked against the single-process reference."""
    lr: float = 0.1
    warmup: int = 2
    repeats: int = 15
    """Timed steps of the block stack per cell; the median of the slowest rank is reported."""
    paired: bool = True
    """Time each cell's other method on twin weights in alternating steps (the speed ratio)."""
    timeout_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_positive("tp_degrees", self.tp_degrees)
        check_choices("methods", self.methods, METHODS)
        check_training(self, ("batch_size", "steps", "repeats"))
        cfg = check_gpt_model(self.model)
        for t in self.tp_degrees:
            try:
                check_tp_config(cfg, t)
            except ValueError as error:
                raise ValueError(f"tp_degrees={self.tp_degrees}: {error}") from error


def cells(cfg: TensorParallelConfig) -> list[Cell]:
    """Every (method, t), t ascending (the runner reuses one pool per world size)."""
    out = []
    for t in sorted(set(cfg.tp_degrees)):
        for method in cfg.methods:
            task = TPCell(
                method=method,
                model=dict(cfg.model),
                batch_size=cfg.batch_size,
                steps=cfg.steps,
                lr=cfg.lr,
                warmup=cfg.warmup,
                repeats=cfg.repeats,
                paired=cfg.paired,
                seed=cfg.seed,
            )
            key = {"method": method, "tp": t}
            out.append(Cell(world_size=t, key=key, fn=run_tp_cell, task=task))
    return out


def _max(per_rank: list[dict], key: str) -> float:
    values = [r[key] for r in per_rank]
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _count(per_rank: list[dict], direction: str, name: str | None) -> int:
    """Collectives of kind `name` (None: of any kind) one rank issued in one direction."""
    calls = per_rank[0][f"collectives_{direction}"]
    return sum(calls.values()) if name is None else calls.get(name, 0)


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: TPCell = cell.task
    t, first = cell.world_size, per_rank[0]
    cfg = GPTConfig(**task.model)
    predicted = analytic_comm(task.batch_size, cfg.seq_len, cfg.d_model, t)
    fwd_ar, bwd_ar = _count(per_rank, "fwd", "all_reduce"), _count(per_rank, "bwd", "all_reduce")
    memory = [r["memory"] for r in per_rank]
    row: dict[str, Any] = {
        **cell.key,
        "impl": "torch" if task.method.startswith("torch") else "distbench",
        "params": first["params"],
        **task.model,
        "batch_size": task.batch_size,
        "steps": task.steps,
        "loss": first["losses"][-1],
        "loss_diff": first["loss_diff"],
        "update_error": first["update_error"],
        "wrong": int(not first["update_error"] <= TOLERANCE),
        # One transformer block (attention + MLP), the busiest rank.
        "comm_bytes_per_layer_fwd": _max(per_rank, "bytes_sent_fwd"),
        "comm_bytes_per_layer_bwd": _max(per_rank, "bytes_sent_bwd"),
        "comm_rounds_per_layer_fwd": _max(per_rank, "rounds_fwd"),
        "comm_rounds_per_layer_bwd": _max(per_rank, "rounds_bwd"),
        "allreduces_per_layer_fwd": fwd_ar,
        "allreduces_per_layer_bwd": bwd_ar,
        "allreduces_per_layer": fwd_ar + bwd_ar,
        "collectives_per_layer": _count(per_rank, "fwd", None) + _count(per_rank, "bwd", None),
        "predicted_comm_bytes_per_layer_fwd": predicted.bytes_sent_fwd if t > 1 else 0,
        "predicted_comm_bytes_per_layer_bwd": predicted.bytes_sent_bwd if t > 1 else 0,
        "predicted_allreduces_per_layer": (predicted.allreduces_fwd + predicted.allreduces_bwd)
        if t > 1
        else 0,
        "param_bytes": max(m["current"]["params"] for m in memory),
        "activation_bytes": max(m["peak"]["activations"] for m in memory),
        "peak_bytes": max(m["peak_total"] for m in memory),
        "step_time_s": statistics.median(first["step_times_s"]),
        "twin": TWIN[task.method] if first["twin_step_times_s"] else "",
        "twin_step_time_s": math.nan,
        "step_time_vs_twin": math.nan,
    }
    if first["twin_step_times_s"]:
        row["twin_step_time_s"] = statistics.median(first["twin_step_times_s"])
        row["step_time_vs_twin"] = row["step_time_s"] / row["twin_step_time_s"]
    return row


EXPERIMENT = Experiment(
    name="tensor_parallel",
    schema=TensorParallelConfig,
    key_columns=["method", "tp"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
