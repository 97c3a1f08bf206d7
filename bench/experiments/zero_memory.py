"""Experiment `zero_memory`: plain DP and ZeRO-1/2/3 trained for real, every byte a rank
holds counted, beside the ZeRO paper's formulas and torch's DDP, ZeroRedundancyOptimizer
and FSDP2 on the same model and ranks.

A cell is (method, world size N, precision). The distbench methods `dp`, `zero1`,
`zero2`, `zero3` are `impls.zero.ZeroDataParallel` at stage 0–3 (key `stages`); `methods`
adds distbench's bucketed DDP with and without overlap and torch.distributed's
counterparts (see `bench.zero_cells`). Each cell trains `steps` AdamW steps on a GPT,
each rank on its 1/N of the batch, checks the parameters against a single-process
reference, reads the rank's model-state bytes (the `MemoryLedger` for ZeRO, the tensors
held for the others) and its traffic counters for one step, and times `repeats` steps;
with `paired`, each distbench cell also times its torch twin in alternating steps.

Beside every measurement stands the cost model's prediction (`impls.costmodel.memory`,
padding included): model states per stage and N, and 2Ψ or 3Ψ of traffic per step.
torch's rows run fp32 only (mixed precision in torch is a different recipe: autocast or
FSDP's MixedPrecisionPolicy) and have no traffic counters (torch's collectives are opaque).
"""

from __future__ import annotations

import logging
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
from bench.reports import zero_memory as report
from bench.zero_cells import (
    DISTBENCH_METHODS,
    STAGE_OF,
    TORCH_METHODS,
    TWINS,
    ZERO_METHODS,
    ZeroCell,
    run_zero_cell,
)
from impls.costmodel.memory import (
    bytes_per_param_for,
    comm_bytes_per_step,
    comm_psi_multiple,
    model_state_bytes,
)
from impls.precision import PRECISIONS, check_precision

__all__ = ["EXPERIMENT", "ZeroMemoryConfig", "cells", "to_row"]

log = logging.getLogger("bench")

EXTRA_METHODS = ("ddp", "ddp_no_overlap", *TORCH_METHODS)
METHOD_OF_STAGE = {stage: method for method, stage in ZERO_METHODS.items()}
# Relative error of the whole model's update against the fp32 single-process reference
# after `steps` AdamW steps (`bench.zero_cells._compare`). fp32: the same arithmetic in
# another order, rounding only (2e-5 on the default GPT at N = 2, torch's DDP alike).
# bf16/fp16: weights and gradients rounded to 8/11 significant bits (bf16 measured 0.064
# here; the ZeRO tests measured 0.071 for bf16 and 0.031 for fp16 on their GPT).
TOLERANCE = {"fp32": 1e-3, "bf16": 0.15, "fp16": 0.08}


@dataclass(kw_only=True)
class ZeroMemoryConfig:
    stages: list[int] = field(default_factory=lambda: [0, 1, 2, 3])
    """distbench ZeRO stages to run (0: plain data parallelism, the memory baseline)."""
    world_sizes: list[int] = field(default_factory=lambda: [1, 2, 4, 8])
    """Data-parallel degrees N; each must divide batch_size."""
    precision: list[str] | str = field(default_factory=lambda: ["fp32", "bf16"])
    """fp32 (4 + 4 + 8 bytes per parameter) and/or mixed precision fp16 / bf16 (2 + 2 + 12)."""
    loss_scale: str | float | None = "dynamic"
    """fp16's loss scaling: "dynamic" or a fixed scale (ignored by fp32 and bf16)."""
    methods: list[str] = field(default_factory=lambda: list(EXTRA_METHODS))
    """Also run these: distbench's DDP with/without overlap, and torch's baselines."""
    model: dict[str, int] = field(
        default_factory=lambda: {
            "d_model": 64, "n_layers": 4, "n_heads": 4, "seq_len": 32, "vocab_size": 128,
            "bias": False,
        }
    )  # fmt: skip
    """`GPTConfig` keyword arguments of the model every cell trains. Without biases by
    default: k_proj's bias gets an identically zero gradient (softmax is shift-invariant),
    which Adam turns into ±lr steps of pure rounding noise, so no distributed run — torch's
    DDP included — can match the one-process reference on it."""
    batch_size: int = 16
    """Sequences per step over all ranks (rank r trains on its 1/N)."""
    steps: int = 3
    """AdamW steps checked against the single-process reference."""
    lr: float = 1e-3
    bucket_cap_bytes: int = 2 << 20
    """distbench DDP's gradient bucket size. On 2 ranks of this 2-core host, 2 MiB measured
    best for the default GPT (5 MB of gradients): 1 MiB buckets pay more per-round latency,
    4–8 MiB leave too little to overlap (overlapped ÷ serial 0.96× vs 0.99–1.03×)."""
    warmup: int = 1
    repeats: int = 5
    """Timed steps per cell; the median of the slowest rank's step is reported."""
    paired: bool = True
    """Time each fp32 distbench cell's torch twin in alternating steps (the speed ratio)."""
    timeout_s: float = 600.0
    seed: int = 0

    def __post_init__(self) -> None:
        self.precision = [self.precision] if isinstance(self.precision, str) else self.precision
        bad = [s for s in self.stages if isinstance(s, bool) or s not in METHOD_OF_STAGE]
        if bad or not self.stages:
            raise ValueError(f"stages={self.stages}: {bad} not a ZeRO stage; allowed: 0, 1, 2, 3")
        check_positive("world_sizes", self.world_sizes)
        check_choices("precision", self.precision, PRECISIONS)
        for precision in self.precision:
            check_precision(precision, self.loss_scale if precision == "fp16" else None)
        if self.methods:
            check_choices("methods", self.methods, EXTRA_METHODS)
        check_training(self, ("batch_size", "steps", "repeats", "bucket_cap_bytes"))
        uneven = [n for n in self.world_sizes if self.batch_size % n]
        if uneven:
            raise ValueError(
                f"world_sizes={uneven} do not divide batch_size={self.batch_size}: every rank "
                "trains on an equal share of the batch"
            )
        check_gpt_model(self.model)


def cells(cfg: ZeroMemoryConfig) -> list[Cell]:
    """Every (method, N, precision), N ascending (the runner reuses one pool per N)."""
    out = []
    distbench = [METHOD_OF_STAGE[s] for s in cfg.stages]
    distbench += [m for m in cfg.methods if m in DISTBENCH_METHODS]
    torch_methods = [m for m in cfg.methods if m in TORCH_METHODS]
    for n in sorted(set(cfg.world_sizes)):
        for precision in cfg.precision:
            methods = distbench + (torch_methods if precision == "fp32" else [])
            for method in methods:
                task = ZeroCell(
                    method=method,
                    model=dict(cfg.model),
                    precision=precision,
                    loss_scale=cfg.loss_scale if precision == "fp16" else None,
                    batch_size=cfg.batch_size,
                    steps=cfg.steps,
                    warmup=cfg.warmup,
                    repeats=cfg.repeats,
                    lr=cfg.lr,
                    bucket_cap_bytes=cfg.bucket_cap_bytes,
                    seed=cfg.seed,
                    paired=cfg.paired and precision == "fp32" and method in TWINS,
                )
                key = {"method": method, "world_size": n, "precision": precision}
                out.append(Cell(world_size=n, key=key, fn=run_zero_cell, task=task))
    return out


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: ZeroCell = cell.task
    n, first = cell.world_size, per_rank[0]
    stage, params = STAGE_OF[task.method], first["params"]
    torch_impl = task.method in TORCH_METHODS
    row: dict[str, Any] = {
        **cell.key,
        "impl": "torch" if torch_impl else "distbench",
        "stage": stage,
        "params": params,
        **task.model,
        "batch_size": task.batch_size,
        "steps": task.steps,
        "loss": first["losses"][-1],
        "max_param_diff": first["max_param_diff"],
        "update_error": first["update_error"],
        "wrong": int(not first["update_error"] <= TOLERANCE[task.precision]),
        "step_time_s": statistics.median(first["step_times_s"]),
        "torch_step_time_s": math.nan,
        "step_time_vs_torch": math.nan,
        "twin": TWINS.get(task.method, ""),
    }
    if first["torch_step_times_s"]:
        row["torch_step_time_s"] = statistics.median(first["torch_step_times_s"])
        row["step_time_vs_torch"] = row["step_time_s"] / row["torch_step_time_s"]
    no_overlap = first.get("no_overlap_step_times_s")
    row["step_time_vs_no_overlap"] = (
        row["step_time_s"] / statistics.median(no_overlap) if no_overlap else math.nan
    )
    row.update(_memory_columns(task, per_rank, stage, n))
    row.update(_traffic_columns(task, per_rank, stage, n))
    return row


def _memory_columns(task: ZeroCell, per_rank: list[dict], stage: int, n: int) -> dict:
    """Measured model states (the largest rank's: ranks differ by padding at most), peaks,
    and the cost model's prediction for the same units, padding included."""
    first = per_rank[0]
    units = first["units"] or [first["params"]]
    predicted = model_state_bytes(
        units, stage, n, bytes_per_param_for(task.precision), pad=first["units"] is not None
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


def _traffic_columns(task: ZeroCell, per_rank: list[dict], stage: int, n: int) -> dict:
    """Bytes the busiest rank sent in one training step, against 2Ψ(N−1)/N or 3Ψ(N−1)/N."""
    first = per_rank[0]
    elem = bytes_per_param_for(task.precision).weights  # what the collectives move
    units = first["units"] or [first["params"]]
    sent = [r["bytes_sent"] for r in per_rank]
    measured = math.nan if any(math.isnan(s) for s in sent) else max(sent)
    return {
        "comm_bytes_per_step": measured,
        "predicted_comm_bytes_per_step": comm_bytes_per_step(
            units, stage, n, elem, pad=first["units"] is not None
        ),
        "comm_psi_multiple": measured / (first["params"] * elem),
        "predicted_comm_psi_multiple": comm_psi_multiple(stage, n),
    }


EXPERIMENT = Experiment(
    name="zero_memory",
    schema=ZeroMemoryConfig,
    key_columns=["method", "world_size", "precision"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
