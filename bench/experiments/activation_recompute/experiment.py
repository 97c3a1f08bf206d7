"""`activation_recompute`: full and selective activation recomputation (Korthikanti et al.
2022, "Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198) on
one transformer layer, under tensor parallelism of degree t and Megatron sequence
parallelism.

A cell is (recompute, t, sp, s) on t ranks; `ranks.py` measures the bytes the layer saves
for backward, checks its output and gradients against the same layer without
recomputation, and times it beside that twin. The theory and model columns beside each
measurement: `to_row`.
"""

from __future__ import annotations

import math
import statistics

from bench.charts import Chart
from bench.experiments.activation_recompute import ranks, report
from bench.experiments.activation_recompute.config import ActivationRecomputeConfig
from bench.experiments.base import Cell, Experiment
from impls.costmodel.activations import (
    activation_bytes_per_layer,
    implementation_activation_bytes_per_layer,
)
from impls.costmodel.compute import TransformerSpec, layer_forward_flops

__all__ = ["EXPERIMENT", "cells", "predicted_flops_overhead", "to_row"]

ELEMENT_BYTES = {"bf16": 2, "fp16": 2, "fp32": 4}


def cells(cfg: ActivationRecomputeConfig) -> list[Cell]:
    """Every (recompute, t, sp, s), t ascending; SP only where t > 1."""
    out = []
    for t in sorted(set(cfg.tp)):
        for sp in sorted({s for s in cfg.sp if t > 1 or not s}):
            for mode in cfg.recompute:
                for seq_len in sorted(set(cfg.seq_lens)):
                    key = {"recompute": mode, "tp": t, "sp": sp, "seq_len": seq_len}
                    out.append(Cell(world_size=t, key=key, fn=ranks.run))
    return out


def predicted_flops_overhead(spec: TransformerSpec, batch: int, recompute: str) -> float:
    """Recomputed FLOPs ÷ one layer's forward + backward FLOPs (3 forwards)."""
    parts = layer_forward_flops(spec, batch, spec.seq_len)
    layer = sum(parts.values())
    extra = {"none": 0.0, "selective": parts["attention"], "full": layer}[recompute]
    return extra / (3 * layer)


def _predictions(cfg: ActivationRecomputeConfig, key: dict) -> dict:
    gpt = cfg.gpt_config(key["seq_len"])
    spec = TransformerSpec(
        n_layers=1,
        d_model=gpt.d_model,
        n_heads=gpt.n_heads,
        vocab_size=gpt.vocab_size,
        seq_len=key["seq_len"],
        d_ff=gpt.d_ff,
    )
    e = ELEMENT_BYTES[cfg.dtype]
    paper = activation_bytes_per_layer(
        spec,
        cfg.micro_batch,
        tp=key["tp"],
        sp="megatron_sp" if key["sp"] else "none",
        recompute=key["recompute"],
        dtype_bytes=e,
    )
    model = math.nan
    if cfg.attention == "materialized" or key["recompute"] != "none":
        model = implementation_activation_bytes_per_layer(
            micro_batch=cfg.micro_batch,
            seq_len=key["seq_len"],
            d_model=gpt.d_model,
            n_heads=gpt.n_heads,
            d_ff=gpt.d_ff,
            tp=key["tp"],
            sp=key["sp"],
            recompute=key["recompute"],
            dtype_bytes=e,
            dropout=gpt.dropout > 0,
        )
    return {
        "paper_bytes_per_layer": paper,
        "model_bytes_per_layer": model,
        "predicted_flops_overhead": predicted_flops_overhead(
            spec, cfg.micro_batch, key["recompute"]
        ),
        "d_model": gpt.d_model,
        "n_heads": gpt.n_heads,
        "dropout": gpt.dropout,
    }


def to_row(cfg: ActivationRecomputeConfig, cell: Cell, per_rank: list[dict]) -> dict:
    """- `paper_bytes_per_layer`: the paper's equations (`activation_bytes_per_layer`): no
      recomputation sbh(34 + 5as/h); TP sbh(10 + 24/t + 5as/(ht)); TP + SP sbh(34/t +
      5as/(ht)); selective drops the 5as²b term; full keeps 2sbh (÷ t with SP);
    - `model_bytes_per_layer`: what this implementation saves, exactly
      (`implementation_activation_bytes_per_layer`; materialized attention, or any attention
      under selective and full recomputation, which never keep the fused kernel's tensors);
    - `predicted_flops_overhead`: the recomputed FLOPs over one layer's forward + backward
      (3 forwards), from the paper's FLOP count (`impls.costmodel.compute`): full 1/3,
      selective 4bs²h / (3·(24bsh² + 4bs²h)) — beside `overhead_vs_none`, measured.
    """
    predicted = _predictions(cfg, cell.key)
    saved = max(r["saved_bytes"] for r in per_rank)
    step = max(r["step_time_s"] for r in per_rank)
    none = max(r["none_step_time_s"] for r in per_rank)
    longest = [r["max_seq_len_in_budget"] for r in per_rank]
    return {
        **cell.key,
        "micro_batch": cfg.micro_batch,
        "dtype": cfg.dtype,
        "attention": cfg.attention,
        **predicted,
        "saved_bytes_per_layer": saved,
        "saved_vs_paper": saved / predicted["paper_bytes_per_layer"],
        "paper_deviation": abs(saved / predicted["paper_bytes_per_layer"] - 1),
        "saved_vs_model": saved / predicted["model_bytes_per_layer"],
        "step_time_s": step,
        "none_step_time_s": none,
        "overhead_vs_none": step / none - 1,
        "budget_bytes": cfg.budget_bytes,
        "max_seq_len_in_budget": math.nan if longest[0] is None else min(longest),
        "step_time_spread": statistics.pstdev([r["step_time_s"] for r in per_rank]),
        "wrong": sum(r["wrong"] for r in per_rank),
    }


EXPERIMENT = Experiment(
    name="activation_recompute",
    summary="Full / selective recomputation: saved bytes per layer vs Korthikanti, time overhead",
    schema=ActivationRecomputeConfig,
    key_columns=("recompute", "tp", "sp", "seq_len"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Saved bytes per layer against sequence length",
            x="seq_len",
            y="saved_bytes_per_layer",
            group="recompute",
            log_x=True,
            log_y=True,
        ),
        Chart(
            title="Step time overhead of recomputation",
            x="seq_len",
            y="overhead_vs_none",
            group="recompute",
            kind="scatter",
        ),
    ),
)
