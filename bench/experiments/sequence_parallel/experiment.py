"""`sequence_parallel`: Megatron-SP, DeepSpeed-Ulysses and Ring Attention on one transformer
layer, their communication per link and activation memory per rank measured beside the
papers' formulas, and the longest sequence each trains within a memory budget.

A cell is (method, sequence-parallel degree P, sequence length s); `ranks.py` runs one
block's forward and backward on P ranks and reads the communicator's counters, a memory
ledger and the step time, and checks every output and gradient against the single-device
block. Beside each measurement its prediction (`theory.py`, built once per cell). "Per
link" is Jacobs et al.'s: the bytes one rank puts on its link in the layer's forward plus
backward (it receives as many); measured as the busiest rank's.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.sequence_parallel import ranks, report
from bench.experiments.sequence_parallel.config import SequenceParallelConfig
from bench.experiments.sequence_parallel.ranks import TOLERANCE
from bench.experiments.sequence_parallel.theory import Plan, plan

__all__ = ["EXPERIMENT", "cells", "to_row"]


def cells(cfg: SequenceParallelConfig) -> list[Cell]:
    """Every (method, P, s), P ascending (the runner reuses one pool per world size); each
    carries its block and its predictions (`theory.plan`).

    Every method accepts any sequence length ≥ 1: P need not divide s, the chunks are
    end-padded to ceil(s/P) and the causal mask hides the padding (`impls.sequence_parallel.
    common`; tested in tests/sequence_parallel with s = 3, 7, 10, 12 on P = 2 and 4). What
    cannot split is refused here: Ulysses needs P to divide the heads, Megatron-SP (tensor-
    parallel inside) the heads, the width and the MLP width.
    """
    out = []
    for sp in sorted(set(cfg.sp_degrees)):
        for method in cfg.methods:
            for seq_len in sorted(set(cfg.seq_lens)):
                carry = plan(
                    method,
                    sp,
                    seq_len,
                    model=cfg.model,
                    batch=cfg.batch_size,
                    budget_bytes=cfg.memory_budget_bytes,
                )
                key = {"method": method, "sp": sp, "seq_len": seq_len}
                out.append(Cell(world_size=sp, key=key, fn=ranks.run, carry=carry))
    return out


def _traffic_columns(predicted: Any, per_rank: list[dict]) -> dict[str, Any]:
    """The busiest rank's bytes in one layer's forward and backward, beside the formula."""
    sent = [r["fwd"]["bytes_sent"] + r["bwd"]["bytes_sent"] for r in per_rank]
    recv = [r["fwd"]["bytes_recv"] + r["bwd"]["bytes_recv"] for r in per_rank]
    per_link = max(sent)
    return {
        "comm_bytes_per_link_per_layer": per_link,
        "predicted_comm_bytes_per_link_per_layer": predicted.bytes_per_link,
        "comm_vs_predicted": per_link / predicted.bytes_per_link
        if predicted.bytes_per_link
        else math.nan,
        "comm_bytes_recv_per_link_per_layer": max(recv),
        "comm_bytes_fwd": max(r["fwd"]["bytes_sent"] for r in per_rank),
        "predicted_comm_bytes_fwd": predicted.bytes_fwd,
        "comm_bytes_bwd": max(r["bwd"]["bytes_sent"] for r in per_rank),
        "predicted_comm_bytes_bwd": predicted.bytes_bwd,
        "comm_rounds": max(r["fwd"]["rounds"] + r["bwd"]["rounds"] for r in per_rank),
        "predicted_comm_rounds": predicted.rounds_fwd + predicted.rounds_bwd,
        "grad_sync_bytes_per_step": max(r["grad_sync"]["bytes_sent"] for r in per_rank),
    }


def _memory_columns(cfg: SequenceParallelConfig, carry: Plan, per_rank: list[dict]) -> dict:
    """Measured bytes per rank (the largest rank's), the implementation model the rows
    check, the paper formula, and the longest sequence within the budget from each."""
    measured = max(r["activation_bytes"] for r in per_rank)
    return {
        "activation_bytes_per_rank": measured,
        "model_activation_bytes_per_rank": carry.model_bytes,
        "activation_vs_model": measured / carry.model_bytes,
        "predicted_activation_bytes_per_rank": carry.paper_bytes,
        "activation_vs_predicted": measured / carry.paper_bytes,
        "param_bytes": max(r["param_bytes"] for r in per_rank),
        "grad_bytes": max(r["grad_bytes"] for r in per_rank),
        "peak_bytes": max(r["peak_bytes"] for r in per_rank),
        "memory_budget_bytes": cfg.memory_budget_bytes,
        "budget_layers": carry.layers,
        "max_seq_len_in_budget": carry.longest,
        "paper_max_seq_len_in_budget": carry.paper_longest,
    }


def to_row(cfg: SequenceParallelConfig, cell: Cell, per_rank: list[dict]) -> dict:
    carry, (sp, seq_len) = cell.carry, (cell.key["sp"], cell.key["seq_len"])
    local = math.ceil(seq_len / sp)
    errors = [e for r in per_rank for e in r["errors"].values()]
    return {
        **cell.key,
        "batch_size": cfg.batch_size,
        "d_model": carry.block.d_model,
        "n_heads": carry.block.n_heads,
        "d_ff": carry.block.ff_dim,
        "local_seq_len": local,
        "padded_positions": local * sp - seq_len,
        **_traffic_columns(carry.traffic, per_rank),
        **_memory_columns(cfg, carry, per_rank),
        "step_time_s": statistics.median(per_rank[0]["step_times_s"]),
        "max_error": max(errors),
        "tolerance": TOLERANCE,
        "wrong": sum(r["wrong"] for r in per_rank),
    }


EXPERIMENT = Experiment(
    name="sequence_parallel",
    summary="Megatron-SP, Ulysses, Ring Attention: bytes per link, activations per rank",
    schema=SequenceParallelConfig,
    key_columns=("method", "sp", "seq_len"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Bytes per link per layer against sequence length",
            x="seq_len",
            y="comm_bytes_per_link_per_layer",
            group="method",
            kind="scatter",
            log_x=True,
            log_y=True,
        ),
        Chart(
            title="Activation bytes per rank against sequence length",
            x="seq_len",
            y="activation_bytes_per_rank",
            group="method",
            kind="scatter",
            log_x=True,
            log_y=True,
        ),
    ),
)
