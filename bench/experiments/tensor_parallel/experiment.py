"""`tensor_parallel`: Megatron tensor parallelism of the GPT, beside torch's DTensor
`parallelize_module`, at each TP degree t.

A cell is (method, t). Both methods split the same GPT over t ranks (`ranks.py`):
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
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.tensor_parallel import ranks, report
from bench.experiments.tensor_parallel.config import TensorParallelConfig
from bench.experiments.tensor_parallel.ranks import TWIN, Sides
from impls.models import GPTConfig
from impls.tensor_parallel import analytic_comm

__all__ = ["EXPERIMENT", "TOLERANCE", "cells", "to_row"]

# Relative error of the whole model's SGD update against one process, fp32: the same
# arithmetic summed in another order (5.7e-7 measured at t = 2 on the CI model).
TOLERANCE = 1e-4


def cells(cfg: TensorParallelConfig) -> list[Cell]:
    """Every (method, t), t ascending (the runner reuses one pool per world size); each
    carries its twin and Megatron's count for its t."""
    model = GPTConfig(**cfg.model)
    out = []
    for t in sorted(set(cfg.tp_degrees)):
        predicted = (
            analytic_comm(cfg.batch_size, model.seq_len, model.d_model, t) if t > 1 else None
        )
        for method in cfg.methods:
            sides = Sides(method, TWIN[method] if cfg.paired else None, predicted)
            key = {"method": method, "tp": t}
            out.append(Cell(world_size=t, key=key, fn=ranks.run, carry=sides))
    return out


def _max(per_rank: list[dict], key: str) -> float:
    values = [r[key] for r in per_rank]
    return math.nan if any(math.isnan(v) for v in values) else max(values)


def _count(per_rank: list[dict], direction: str, name: str | None) -> int:
    """Collectives of kind `name` (None: of any kind) one rank issued in one direction."""
    calls = per_rank[0][f"collectives_{direction}"]
    return sum(calls.values()) if name is None else calls.get(name, 0)


def _traffic(cell: Cell, per_rank: list[dict]) -> dict[str, Any]:
    """One transformer block (attention + MLP), the busiest rank, beside Megatron's count."""
    predicted: Any = cell.carry.predicted
    fwd_ar, bwd_ar = _count(per_rank, "fwd", "all_reduce"), _count(per_rank, "bwd", "all_reduce")
    return {
        "comm_bytes_per_layer_fwd": _max(per_rank, "bytes_sent_fwd"),
        "comm_bytes_per_layer_bwd": _max(per_rank, "bytes_sent_bwd"),
        "comm_rounds_per_layer_fwd": _max(per_rank, "rounds_fwd"),
        "comm_rounds_per_layer_bwd": _max(per_rank, "rounds_bwd"),
        "allreduces_per_layer_fwd": fwd_ar,
        "allreduces_per_layer_bwd": bwd_ar,
        "allreduces_per_layer": fwd_ar + bwd_ar,
        "collectives_per_layer": _count(per_rank, "fwd", None) + _count(per_rank, "bwd", None),
        "predicted_comm_bytes_per_layer_fwd": predicted.bytes_sent_fwd if predicted else 0,
        "predicted_comm_bytes_per_layer_bwd": predicted.bytes_sent_bwd if predicted else 0,
        "predicted_allreduces_per_layer": (predicted.allreduces_fwd + predicted.allreduces_bwd)
        if predicted
        else 0,
    }


def to_row(cfg: TensorParallelConfig, cell: Cell, per_rank: list[dict]) -> dict:
    first, memory = per_rank[0], [r["memory"] for r in per_rank]
    step = statistics.median(first["step_times_s"])
    twin = first["twin_step_times_s"]
    twin_step = statistics.median(twin) if twin else math.nan
    return {
        **cell.key,
        "impl": "torch" if cell.key["method"].startswith("torch") else "distbench",
        "params": first["params"],
        **cfg.model,
        "batch_size": cfg.batch_size,
        "steps": cfg.steps,
        "loss": first["losses"][-1],
        "loss_diff": first["loss_diff"],
        "update_error": first["update_error"],
        "wrong": int(not first["update_error"] <= TOLERANCE),
        **_traffic(cell, per_rank),
        "param_bytes": max(m["current"]["params"] for m in memory),
        "activation_bytes": max(m["peak"]["activations"] for m in memory),
        "peak_bytes": max(m["peak_total"] for m in memory),
        "step_time_s": step,
        "twin": cell.carry.twin if twin else "",
        "twin_step_time_s": twin_step,
        "step_time_vs_twin": step / twin_step if twin else math.nan,
    }


EXPERIMENT = Experiment(
    name="tensor_parallel",
    summary="Megatron TP vs DTensor per degree t: traffic vs Megatron's count, memory, speed",
    schema=TensorParallelConfig,
    key_columns=("method", "tp"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(title="Step time against TP degree", x="tp", y="step_time_s", group="method"),
        Chart(
            title="Peak memory per rank against TP degree",
            x="tp",
            y="peak_bytes",
            group="method",
            log_x=True,
        ),
        Chart(
            title="Bytes per layer, forward", x="tp", y="comm_bytes_per_layer_fwd", group="method"
        ),
    ),
)
