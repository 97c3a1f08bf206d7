"""`zero_memory`: plain DP and ZeRO-1/2/3 trained for real, every byte a rank holds
counted, beside the ZeRO paper's formulas and torch's DDP, ZeroRedundancyOptimizer and
FSDP2 on the same model and ranks.

A cell is (method, world size N, precision). The distbench methods `dp`, `zero1`,
`zero2`, `zero3` are `impls.zero.ZeroDataParallel` at stage 0–3 (key `stages`); `methods`
adds distbench's bucketed DDP with and without overlap and torch.distributed's
counterparts (`methods.py`). Beside every measurement stands the cost model's prediction
(`impls.costmodel.memory`, padding included): model states per stage and N, and 2Ψ or 3Ψ
of traffic per step. torch's rows run fp32 only (mixed precision in torch is a different
recipe: autocast or FSDP's MixedPrecisionPolicy) and have no traffic counters (torch's
collectives are opaque).
"""

from __future__ import annotations

import json
import math
import statistics
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.zero_memory import ranks, report
from bench.experiments.zero_memory.config import ZeroMemoryConfig
from bench.experiments.zero_memory.methods import (
    DISTBENCH_METHODS,
    METHOD_OF_STAGE,
    TOLERANCE,
    TORCH_METHODS,
    TWINS,
    Plan,
)
from impls.costmodel.memory import (
    bytes_per_param_for,
    comm_bytes_per_step,
    comm_psi_multiple,
    model_state_bytes,
)

__all__ = ["EXPERIMENT", "TOLERANCE", "ZeroMemoryConfig", "cells", "to_row"]


def _plan(cfg: ZeroMemoryConfig, method: str, precision: str) -> Plan:
    paired = cfg.paired and precision == "fp32" and method in TWINS
    return Plan(
        method=method,
        precision=precision,
        loss_scale=cfg.loss_scale if precision == "fp16" else None,
        twin=TWINS[method] if paired else "",
        no_overlap=paired and method == "ddp",
    )


def cells(cfg: ZeroMemoryConfig) -> list[Cell]:
    """Every (method, N, precision), N ascending (the runner reuses one pool per N)."""
    distbench = [METHOD_OF_STAGE[s] for s in cfg.stages]
    distbench += [m for m in cfg.methods if m in DISTBENCH_METHODS]
    torch_methods = [m for m in cfg.methods if m in TORCH_METHODS]
    out = []
    for n in sorted(set(cfg.world_sizes)):
        for precision in cfg.precision:
            for method in distbench + (torch_methods if precision == "fp32" else []):
                key = {"method": method, "world_size": n, "precision": precision}
                carry = _plan(cfg, method, precision)
                out.append(Cell(world_size=n, key=key, fn=ranks.run, carry=carry))
    return out


def to_row(cfg: ZeroMemoryConfig, cell: Cell, per_rank: list[dict]) -> dict:
    plan: Plan = cell.carry
    first = per_rank[0]
    row: dict[str, Any] = {
        **cell.key,
        "impl": plan.impl,
        "stage": plan.stage,
        "params": first["params"],
        **cfg.model,
        "batch_size": cfg.batch_size,
        "steps": cfg.steps,
        "loss": first["losses"][-1],
        "losses": json.dumps(first["losses"]),  # per step: wandb draws them as a curve
        "step_times_s": json.dumps(first["step_times_s"]),
        "max_param_diff": first["max_param_diff"],
        "update_error": first["update_error"],
        "wrong": int(not first["update_error"] <= TOLERANCE[plan.precision]),
        "step_time_s": statistics.median(first["step_times_s"]),
        "torch_step_time_s": math.nan,
        "step_time_vs_torch": math.nan,
        "twin": TWINS.get(plan.method, ""),
    }
    if first["torch_step_times_s"]:
        row["torch_step_time_s"] = statistics.median(first["torch_step_times_s"])
        row["step_time_vs_torch"] = row["step_time_s"] / row["torch_step_time_s"]
    no_overlap = first.get("no_overlap_step_times_s")
    row["step_time_vs_no_overlap"] = (
        row["step_time_s"] / statistics.median(no_overlap) if no_overlap else math.nan
    )
    row.update(_memory_columns(plan, per_rank, cell.world_size))
    row.update(_traffic_columns(plan, per_rank, cell.world_size))
    return row


def _memory_columns(plan: Plan, per_rank: list[dict], n: int) -> dict:
    """Measured model states (the largest rank's: ranks differ by padding at most), peaks,
    and the cost model's prediction for the same units, padding included."""
    first = per_rank[0]
    units = first["units"] or [first["params"]]
    predicted = model_state_bytes(
        units, plan.stage, n, bytes_per_param_for(plan.precision), pad=first["units"] is not None
    )
    columns = {
        "predicted_param_bytes": predicted.weights,
        "predicted_grad_bytes": predicted.gradients,
        "predicted_optim_bytes": predicted.optimizer,
        "predicted_model_state_bytes": predicted.total,
    }
    held = [r["held"] for r in per_rank if r["held"] is not None]
    for name, key in (("param_bytes", "params"), ("grad_bytes", "grads"), ("optim_bytes", "optim")):
        columns[name] = max(h[key] for h in held) if held else math.nan
    states = [sum(h.values()) for h in held]
    columns["model_state_bytes"] = max(states) if states else math.nan
    columns["model_state_error"] = columns["model_state_bytes"] / predicted.total - 1
    memory = [r["memory"] for r in per_rank if r["memory"]]
    for name, key in (
        ("gathered_peak_bytes", "gathered"),
        ("activation_peak_bytes", "activations"),
    ):
        columns[name] = max(m["peak"][key] for m in memory) if memory else math.nan
    columns["peak_bytes"] = max(m["peak_total"] for m in memory) if memory else math.nan
    return columns


def _traffic_columns(plan: Plan, per_rank: list[dict], n: int) -> dict:
    """Bytes the busiest rank sent in one training step, against 2Ψ(N−1)/N or 3Ψ(N−1)/N."""
    first = per_rank[0]
    elem = bytes_per_param_for(plan.precision).weights  # what the collectives move
    units = first["units"] or [first["params"]]
    sent = [r["bytes_sent"] for r in per_rank]
    measured = math.nan if any(math.isnan(s) for s in sent) else max(sent)
    return {
        "comm_bytes_per_step": measured,
        "predicted_comm_bytes_per_step": comm_bytes_per_step(
            units, plan.stage, n, elem, pad=first["units"] is not None
        ),
        "comm_psi_multiple": measured / (first["params"] * elem),
        "predicted_comm_psi_multiple": comm_psi_multiple(plan.stage, n),
    }


EXPERIMENT = Experiment(
    name="zero_memory",
    summary="DP and ZeRO-1/2/3 per-rank memory and traffic vs the cost model, speed vs torch",
    schema=ZeroMemoryConfig,
    key_columns=("method", "world_size", "precision"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Model states per rank against ranks",
            x="world_size",
            y="model_state_bytes",
            group="method",
            kind="scatter",
            log_y=True,
        ),
        Chart(
            title="Bytes sent per step in units of Ψ",
            x="world_size",
            y="comm_psi_multiple",
            group="method",
            kind="scatter",
        ),
        Chart(title="Step time ÷ torch", x="method", y="step_time_vs_torch", kind="bar"),
    ),
    host_probe=True,  # planner_validation holds its predictions to these rows
)
