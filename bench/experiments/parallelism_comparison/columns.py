"""A `parallelism_comparison` row's memory and traffic columns, per rank and step (the
busiest rank where ranks differ), each beside its theory.

- **memory**: model states (parameters, gradients, AdamW's two moments — 16 bytes per
  parameter in fp32, ZeRO paper §3.1) and the pipeline executor's peak of saved
  activations. Theory beside it: DP holds the whole model on every rank, TP and PP hold
  one copy cut k = pp·tp ways, 16Ψ/k per rank on average (PTD-P §2).
- **communication**: bytes sent on each axis, counted by the mesh's communicators, beside
  the count from the papers (`predicted_traffic`): DP one ring all-reduce of the stage's
  gradients, 2(d−1)/d·(Ψ_rank + 1) elements (the loss rides along); TP Megatron's
  all-reduces of the (b, s, h) activations, two per block each way (Shoeybi et al. 2019,
  §3) plus the vocab-parallel embedding, LM head and cross-entropy; PP one activation
  forward and one gradient backward per micro-batch and stage boundary (GPipe, Huang et
  al. 2019).
"""

from __future__ import annotations

import statistics
from typing import Any

from bench.experiments.parallelism_comparison.ranks import AXES, Layout
from impls.models.stages import stage_layer_ranges

__all__ = ["BYTES_PER_PARAM", "memory_columns", "predicted_traffic", "traffic_columns"]

BYTES_PER_PARAM = 16  # fp32 AdamW: weight, gradient, first and second moment


def _ring_bytes(numel: int, ranks: int) -> float:
    """Bytes one rank sends in a ring all-reduce of `numel` float32: 2(n−1)/n · 4 numel."""
    return 2 * (ranks - 1) / ranks * numel * 4


def predicted_traffic(cfg: Any, layout: Layout, stage: int, rank_params: int) -> dict[str, float]:
    """Bytes a rank of pipeline stage `stage` sends per step on each axis, from the papers'
    counts (see the module docstring); the step's barrier and loss broadcast, a few bytes,
    are left out."""
    model, m, t, micro = layout.gpt, cfg.microbatches, layout.tp, layout.micro_batch
    act = micro * model.seq_len * model.d_model  # one (b, s, h) activation, in elements
    first, last = stage == 0, stage == layout.pp - 1
    blocks = len(stage_layer_ranges(model.n_layers, layout.pp)[stage])
    tp = 0.0
    if t > 1:  # per micro-batch: 2 per block each way; embedding's g; LM head's f; the loss's
        forward = (2 * blocks + first) * _ring_bytes(act, t)
        forward += last * (
            _ring_bytes(micro * model.seq_len, t) + _ring_bytes(2 * micro * model.seq_len, t)
        )
        backward = (2 * blocks + last) * _ring_bytes(act, t)
        tp = m * (forward + backward)
    pp = m * act * 4 * ((not last) + (not first)) if layout.pp > 1 else 0.0
    dp = _ring_bytes(rank_params + 1, layout.dp) if layout.dp > 1 else 0.0
    return {"dp": dp, "pp": pp, "tp": tp}


def memory_columns(per_rank: list[dict], params: int, shards: int) -> dict[str, float]:
    """The rank with the most bytes held (model states + peak activations), its parts,
    and the mean over ranks against one model copy cut `shards` ways."""
    states = [sum(r["held"].values()) for r in per_rank]
    totals = [s + r["peak_activation_bytes"] for s, r in zip(states, per_rank, strict=True)]
    top = per_rank[max(range(len(per_rank)), key=totals.__getitem__)]
    return {
        "param_bytes": top["held"]["params"],
        "grad_bytes": top["held"]["grads"],
        "optim_bytes": top["held"]["optim"],
        "model_state_bytes": max(states),
        "model_state_bytes_mean": statistics.fmean(states),
        "theory_model_state_bytes": BYTES_PER_PARAM * params / shards,
        "activation_peak_bytes": max(r["peak_activation_bytes"] for r in per_rank),
        "memory_per_rank_bytes": max(totals),
        "rank_params_max": max(r["rank_params"] for r in per_rank),
    }


def traffic_columns(cfg: Any, layout: Layout, per_rank: list[dict]) -> dict[str, float]:
    """Bytes and rounds sent per step by the busiest rank, per axis and in total, beside
    the papers' counts."""
    columns: dict[str, float] = {}
    predicted = [
        predicted_traffic(cfg, layout, r["coords"]["pp"], r["rank_params"]) for r in per_rank
    ]
    for axis in AXES:
        columns[f"comm_bytes_{axis}"] = max(r["traffic"][axis]["bytes_sent"] for r in per_rank)
        columns[f"predicted_comm_bytes_{axis}"] = max(p[axis] for p in predicted)
    columns["comm_bytes_per_step"] = max(
        sum(r["traffic"][axis]["bytes_sent"] for axis in AXES) for r in per_rank
    )
    columns["predicted_comm_bytes_per_step"] = max(sum(p.values()) for p in predicted)
    columns["comm_rounds_per_step"] = max(
        sum(r["traffic"][axis]["rounds"] for axis in AXES) for r in per_rank
    )
    return columns
