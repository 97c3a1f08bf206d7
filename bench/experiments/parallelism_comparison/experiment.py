"""`parallelism_comparison`: the lecture's table of DP, TP and PP — utilization, memory per
rank, communication per step — filled with numbers measured on one GPT, with the 2D and
3D compositions beside them.

A cell is one mesh layout (dp, pp, tp) on dp·pp·tp ranks, trained by
`impls.hybrid.HybridTrainer` (Megatron-LM's PTD-P, Narayanan et al. 2021, arXiv
2104.04473, §2.3: TP inside a stage, a pipeline over the stages, gradients averaged over
the replicas); `ranks.py` says what each rank measures. Every layout trains the same
model on the same global batch, split into the same number of micro-batches, with the
same schedule, so that the layouts differ only in how the work is cut. The row's memory
and traffic columns are derived in `columns.py`, its utilization in `replay.py`.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.parallelism_comparison import report
from bench.experiments.parallelism_comparison.columns import (
    memory_columns,
    predicted_traffic,
    traffic_columns,
)
from bench.experiments.parallelism_comparison.config import TOLERANCES, ParallelismComparisonConfig
from bench.experiments.parallelism_comparison.ranks import AXES, Layout, run
from bench.experiments.parallelism_comparison.replay import replay_columns, wall_utilization
from impls.models import GPTConfig
from impls.pipeline import build_plan
from impls.pipeline.theory import gpipe_utilization

__all__ = [
    "EXPERIMENT",
    "ParallelismComparisonConfig",
    "cells",
    "layout_name",
    "predicted_traffic",
    "strategy",
    "to_row",
]


def layout_name(degrees: dict[str, int]) -> str:
    """`dp2×tp2`: the axes with a degree above 1 (`dp1` for a single rank)."""
    used = [f"{axis}{degrees[axis]}" for axis in AXES if degrees[axis] > 1]
    return "×".join(used) or "dp1"


def strategy(degrees: dict[str, int]) -> str:
    """The lecture's row: DP, TP, PP, 2D (two axes) or 3D."""
    used = [axis for axis in AXES if degrees[axis] > 1]
    return used[0].upper() if len(used) == 1 else f"{len(used)}D" if used else "DP"


def cells(cfg: ParallelismComparisonConfig) -> list[Cell]:
    """One cell per layout, world sizes ascending (the runner keeps one pool per size);
    each carries its `Layout`: the GPT's config, the micro-batch and the pipeline plan."""
    model = GPTConfig(**cfg.model)
    out = []
    for degrees in sorted(cfg.layouts, key=lambda d: math.prod(d.values())):
        layout = Layout(
            **degrees,
            gpt=model,
            micro_batch=cfg.batch_size // (degrees["dp"] * cfg.microbatches),
            plan=build_plan(cfg.schedule, degrees["pp"], cfg.microbatches),
        )
        key = {"world_size": math.prod(degrees.values()), **degrees}
        out.append(Cell(world_size=key["world_size"], key=key, fn=run, carry=layout))
    return out


def _errors(per_rank: list[dict]) -> dict[str, float]:
    """The worst rank's relative errors against the single-device reference."""
    first = per_rank[0]
    pairs = zip(first["losses"], first["reference_losses"], strict=True)
    return {
        "loss": max(abs(a - b) / abs(b) for a, b in pairs),
        "update": max(r["update_error"] for r in per_rank),
        "grad": max(r["grad_error"] for r in per_rank),
    }


def to_row(cfg: ParallelismComparisonConfig, cell: Cell, per_rank: list[dict]) -> dict:
    layout: Layout = cell.carry
    first = per_rank[0]
    errors = _errors(per_rank)
    within = all(errors[k] <= tolerance for k, tolerance in TOLERANCES.items())
    row: dict[str, Any] = {
        **cell.key,
        "layout": layout_name(layout.degrees),
        "strategy": strategy(layout.degrees),
        "params": first["params"],
        **cfg.model,
        "batch_size": cfg.batch_size,
        "microbatches": cfg.microbatches,
        "schedule": cfg.schedule,
        "steps": cfg.steps,
        "loss": first["losses"][-1],
        "loss_error": errors["loss"],
        "update_error": errors["update"],
        "grad_error": errors["grad"],
        "max_param_diff": max(r["max_param_diff"] for r in per_rank),
        "wrong": int(not within),
        "step_time_s": statistics.median(first["step_times_s"]),
        "util_wall": wall_utilization(layout, per_rank),
        "util_theory": gpipe_utilization(layout.pp, cfg.microbatches),
    }
    row.update(memory_columns(per_rank, first["params"], layout.pp * layout.tp))
    row.update(traffic_columns(cfg, layout, per_rank))
    row.update(replay_columns(layout, per_rank))
    return row


EXPERIMENT = Experiment(
    name="parallelism_comparison",
    summary="the lecture's DP / TP / PP table and their 2D / 3D hybrids, measured",
    schema=ParallelismComparisonConfig,
    key_columns=("world_size", "dp", "pp", "tp"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(title="Memory per rank by layout", x="layout", y="memory_per_rank_bytes", kind="bar"),
        Chart(
            title="Bytes sent per step by layout", x="layout", y="comm_bytes_per_step", kind="bar"
        ),
        Chart(title="Replayed utilization by layout", x="layout", y="util_replayed", kind="bar"),
    ),
    host_probe=True,  # planner_validation holds its predictions to these rows
)
