"""Experiment `sequence_parallel`: Megatron-SP, DeepSpeed-Ulysses and Ring Attention on one
transformer layer, their communication per link and activation memory per rank measured
beside the papers' formulas, and the longest sequence each trains within a memory budget.

A cell is (method, sequence-parallel degree P, sequence length s); `bench.sp_cells` runs
one block's forward and backward on P ranks and reads the communicator's counters, a
`MemoryLedger` and the step time, and checks every output and gradient against the
single-device block. Beside each measurement its prediction:

- communication per link per layer: `impls.sequence_parallel.analytic.layer_traffic`, the
  papers' volumes with the exact (P − 1)/P factors of ring and all-to-all collectives —
  Korthikanti et al. 2022 (arXiv 2205.05198, §4.2.2) for Megatron-SP, Jacobs et al. 2023
  (arXiv 2309.14509, §3.2) for Ulysses, Liu et al. 2023 (arXiv 2310.01889, §3) for Ring
  Attention. "Per link" is Jacobs et al.'s: the bytes one rank puts on its link in the
  layer's forward plus backward (it receives as many); measured as the busiest rank's.
- activation bytes per rank, twice: the paper formula `analytic.activation_bytes_per_rank`
  (Korthikanti et al. Table 2: 16-bit activations, dropout masks, materialised attention
  scores), and `implementation_activation_bytes`, the same tensor-by-tensor accounting
  applied to what this code saves (fp32, no dropout, torch's fused attention, which keeps
  a log-sum-exp per query instead of the s × s scores). The second is the model the
  measured rows check; the longest sequence within `memory_budget_bytes` comes from it
  (and, labelled, from the paper formula).

Every method accepts any sequence length ≥ 1: P need not divide s, the chunks are
end-padded to ceil(s/P) and the causal mask hides the padding (`impls.sequence_parallel.
common`; tested in tests/sequence_parallel with s = 3, 7, 10, 12 on P = 2 and 4). What
cannot split is refused here: Ulysses needs P to divide the heads, Megatron-SP (tensor-
parallel inside) the heads, the width and the MLP width.
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
from bench.reports import sequence_parallel as report
from bench.sp_cells import METHODS, TOLERANCE, SPCell, run_sp_cell
from impls.models import GPTConfig
from impls.sequence_parallel.analytic import activation_bytes_per_rank, layer_traffic

__all__ = [
    "EXPERIMENT",
    "SequenceParallelConfig",
    "cells",
    "implementation_activation_bytes",
    "longest_seq_len",
    "to_row",
]

FP32 = 4  # bytes per element: every cell runs in float32


@dataclass(kw_only=True)
class SequenceParallelConfig:
    methods: list[str] = field(default_factory=lambda: list(METHODS))
    """Sequence-parallel methods: megatron_sp, ulysses, ring_attention."""
    sp_degrees: list[int] = field(default_factory=lambda: [1, 2, 4])
    """Degrees P (each a cell's world size)."""
    seq_lens: list[int] = field(default_factory=lambda: [128, 255, 512, 1024])
    """Sequence lengths s; P need not divide them (chunks are end-padded)."""
    model: dict[str, Any] = field(
        default_factory=lambda: {"d_model": 64, "n_heads": 4, "n_layers": 4, "bias": True,
                                 "vocab_size": 64}
    )  # fmt: skip
    """`GPTConfig` keyword arguments of the block (no `seq_len`: that is `seq_lens`).
    Cells measure one block; `n_layers` is the depth the memory-budget figure assumes."""
    batch_size: int = 2
    memory_budget_bytes: int = 1 << 30
    """Per-rank budget for the activations of `n_layers` blocks, for the longest-sequence
    figure (weights, gradients and optimizer state not included)."""
    warmup: int = 1
    repeats: int = 5
    """Timed forward + backward passes per cell; the median of the slowest rank's is kept."""
    timeout_s: float = 300.0
    seed: int = 0

    def __post_init__(self) -> None:
        check_choices("methods", self.methods, METHODS)
        check_positive("sp_degrees", self.sp_degrees)
        check_positive("seq_lens", self.seq_lens)
        check_training(self, ("batch_size", "repeats", "memory_budget_bytes"))
        cfg = self._check_model()
        self._check_degrees(cfg)

    def _check_model(self) -> GPTConfig:
        if "seq_len" in self.model:
            raise ValueError(
                f"model.seq_len={self.model['seq_len']}: sequence lengths are the grid key "
                "seq_lens, not a model key"
            )
        if self.model.get("dropout", 0.0):
            raise ValueError(
                f"model.dropout={self.model['dropout']}: sequence-parallel attention runs "
                "without dropout (a random mask could not match the reference); allowed: 0.0"
            )
        return check_gpt_model(self.model, seq_len=max(self.seq_lens))

    def _check_degrees(self, cfg: GPTConfig) -> None:
        """P must split whole heads (Ulysses, Megatron-SP) and Megatron-SP's shards."""
        needs = {"ulysses": {"n_heads": cfg.n_heads}}
        needs["megatron_sp"] = {"n_heads": cfg.n_heads, "d_model": cfg.d_model,
                                "d_ff": cfg.ff_dim}  # fmt: skip
        for method in self.methods:
            for key, size in needs.get(method, {}).items():
                bad = [p for p in self.sp_degrees if size % p]
                if bad:
                    allowed = [p for p in range(1, size + 1) if size % p == 0]
                    raise ValueError(
                        f"sp_degrees={bad} do not divide model.{key}={size}, which {method} "
                        f"splits over the P ranks; allowed sp_degrees: {allowed} (or drop "
                        f"{method} from methods; ring_attention takes any P)"
                    )


def cells(cfg: SequenceParallelConfig) -> list[Cell]:
    """Every (method, P, s), P ascending (the runner reuses one pool per world size)."""
    out = []
    for sp in sorted(set(cfg.sp_degrees)):
        for method in cfg.methods:
            for seq_len in sorted(set(cfg.seq_lens)):
                task = SPCell(
                    method=method,
                    sp=sp,
                    seq_len=seq_len,
                    batch_size=cfg.batch_size,
                    model=dict(cfg.model),
                    warmup=cfg.warmup,
                    repeats=cfg.repeats,
                    seed=cfg.seed,
                    memory_budget_bytes=cfg.memory_budget_bytes,
                )
                key = {"method": method, "sp": sp, "seq_len": seq_len}
                out.append(Cell(world_size=sp, key=key, fn=run_sp_cell, task=task))
    return out


def implementation_activation_bytes(
    method: str, *, sp: int, batch: int, seq_len: int, d_model: int, n_heads: int, d_ff: int
) -> int:
    """Bytes one block of this implementation saves for backward per rank, fp32.

    Korthikanti et al.'s accounting (arXiv 2205.05198, §4.1), tensor by tensor, applied to
    this code, with L = ceil(s/P) positions per rank and S = P·L (padding included):

    - every method: LayerNorm mean and rstd, 2·b·L per LayerNorm; torch's fused causal
      attention keeps q, k, v, its output and one log-sum-exp per query and head — never
      the s × s scores — for a/P heads over S positions (Megatron-SP, Ulysses) or all
      heads over L (Ring Attention): 4·b·L·h + a·b·L either way; the MLP keeps fc1's and
      GELU's outputs, 2·b·L·d_ff (Megatron-SP: d_ff/P units over S positions, the same);
    - Megatron-SP: the block input and the residual (b·L·h each) and the all-gathered
      inputs of QKV and fc1, b·S·h each — kept whole, where the paper re-gathers them in
      backward (§4.2.3), so this term does not shrink with P;
    - Ulysses: block input, LayerNorm output, residual, ln2 output (b·L·h each), and for
      P > 1 o_proj's input, the all-to-all's fresh copy (at P = 1 o_proj reads the
      attention output in place);
    - Ring Attention: as Ulysses, o_proj's input always a copy (the ring's output is
      re-laid out from heads to positions).
    """
    b, h, a = batch, d_model, n_heads
    local = math.ceil(seq_len / sp)
    padded = sp * local
    shared = 4 * b * local + 4 * b * local * h + a * b * local + 2 * b * local * d_ff
    if method == "megatron_sp":
        held = 2 * b * local * h + 2 * b * padded * h
    elif method == "ulysses":
        held = (4 + (sp > 1)) * b * local * h
    else:
        held = 5 * b * local * h
    return FP32 * (shared + held)


def longest_seq_len(activation_bytes, budget_bytes: int, layers: int, limit: int = 1 << 40) -> int:
    """The largest s with layers · activation_bytes(s) ≤ budget (0 if even s = 1 does not
    fit); `activation_bytes` must not decrease with s."""
    if layers * activation_bytes(1) > budget_bytes:
        return 0
    low, high = 1, 2
    while high < limit and layers * activation_bytes(high) <= budget_bytes:
        low, high = high, 2 * high
    while high - low > 1:  # layers · f(low) fits, layers · f(high) does not
        mid = (low + high) // 2
        if layers * activation_bytes(mid) <= budget_bytes:
            low = mid
        else:
            high = mid
    return low


def _shape(task: SPCell) -> dict[str, int]:
    cfg = GPTConfig(**task.model, seq_len=task.seq_len)
    return {"batch": task.batch_size, "d_model": cfg.d_model, "n_heads": cfg.n_heads}


def _traffic_columns(task: SPCell, per_rank: list[dict]) -> dict[str, Any]:
    """The busiest rank's bytes in one layer's forward and backward, beside the formula."""
    shape = _shape(task)
    predicted = layer_traffic(task.method, sp=task.sp, seq_len=task.seq_len,
                              batch=shape["batch"], d_model=shape["d_model"],
                              bytes_per_element=FP32)  # fmt: skip
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


def _memory_columns(task: SPCell, per_rank: list[dict]) -> dict[str, Any]:
    """Measured bytes per rank (the largest rank's), the implementation model the rows
    check, the paper formula, and the longest sequence within the budget from each."""
    shape = _shape(task)
    cfg = GPTConfig(**task.model, seq_len=task.seq_len)

    def modelled(seq_len: int) -> int:
        return implementation_activation_bytes(task.method, sp=task.sp, seq_len=seq_len,
                                               d_ff=cfg.ff_dim, **shape)  # fmt: skip

    def paper(seq_len: int) -> int:
        return activation_bytes_per_rank(task.method, sp=task.sp, seq_len=seq_len, **shape)

    measured = max(r["activation_bytes"] for r in per_rank)
    budget = task.memory_budget_bytes
    return {
        "activation_bytes_per_rank": measured,
        "model_activation_bytes_per_rank": modelled(task.seq_len),
        "activation_vs_model": measured / modelled(task.seq_len),
        "predicted_activation_bytes_per_rank": paper(task.seq_len),
        "activation_vs_predicted": measured / paper(task.seq_len),
        "param_bytes": max(r["param_bytes"] for r in per_rank),
        "grad_bytes": max(r["grad_bytes"] for r in per_rank),
        "peak_bytes": max(r["peak_bytes"] for r in per_rank),
        "memory_budget_bytes": budget,
        "budget_layers": cfg.n_layers,
        "max_seq_len_in_budget": longest_seq_len(modelled, budget, cfg.n_layers),
        "paper_max_seq_len_in_budget": longest_seq_len(paper, budget, cfg.n_layers),
    }


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    task: SPCell = cell.task
    cfg = GPTConfig(**task.model, seq_len=task.seq_len)
    local = math.ceil(task.seq_len / task.sp)
    errors = [e for r in per_rank for e in r["errors"].values()]
    return {
        **cell.key,
        "batch_size": task.batch_size,
        "d_model": cfg.d_model,
        "n_heads": cfg.n_heads,
        "d_ff": cfg.ff_dim,
        "local_seq_len": local,
        "padded_positions": local * task.sp - task.seq_len,
        **_traffic_columns(task, per_rank),
        **_memory_columns(task, per_rank),
        "step_time_s": statistics.median(per_rank[0]["step_times_s"]),
        "max_error": max(errors),
        "tolerance": TOLERANCE,
        "wrong": sum(r["wrong"] for r in per_rank),
    }


EXPERIMENT = Experiment(
    name="sequence_parallel",
    schema=SequenceParallelConfig,
    key_columns=["method", "sp", "seq_len"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
