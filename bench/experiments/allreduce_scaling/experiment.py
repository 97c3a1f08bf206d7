"""`allreduce_scaling`: every all-reduce algorithm × world size × message size, with
torch.distributed.all_reduce as the baseline (the lecture's comparison table)."""

from __future__ import annotations

from bench.charts import Chart
from bench.experiments.allreduce_scaling import report
from bench.experiments.allreduce_scaling.config import AllReduceScalingConfig, declared_columns
from bench.experiments.base import Cell, Experiment
from bench.kit.collectives import (
    CollectiveCall,
    collective_row,
    measure_collective,
)

__all__ = ["EXPERIMENT", "AllReduceScalingConfig"]


def cells(cfg: AllReduceScalingConfig) -> list[Cell]:
    """Every (N, algorithm, S), N ascending (the runner reuses one pool per N)."""
    return [
        Cell(
            world_size=n,
            key={"algorithm": alg, "world_size": n, "message_bytes": m, "dtype": cfg.dtype},
            fn=measure_collective,
            carry=CollectiveCall(
                "all_reduce",
                "torch" if alg == "torch" else "distbench",
                "ring" if alg == "torch" else alg,
            ),
        )
        for n in sorted(set(cfg.world_sizes))
        for alg in cfg.algorithms
        for m in cfg.message_bytes
    ]


def to_row(cfg: AllReduceScalingConfig, cell: Cell, per_rank: list[dict]) -> dict:
    row = collective_row(cell, per_rank, traffic=cell.key["algorithm"] != "torch")
    return row | declared_columns(cell.key["algorithm"])


EXPERIMENT = Experiment(
    name="allreduce_scaling",
    summary="all-reduce algorithms vs torch: rounds, traffic growth with N, busbw, α–β fit",
    schema=AllReduceScalingConfig,
    key_columns=("algorithm", "world_size", "message_bytes", "dtype"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Bus bandwidth against world size",
            x="world_size",
            y="busbw_gbps",
            group="algorithm",
            kind="scatter",
        ),
        Chart(
            title="Bytes sent by the busiest rank",
            x="world_size",
            y="max_rank_bytes_sent",
            group="algorithm",
            kind="scatter",
            log_y=True,
        ),
        Chart(
            title="Time per call against message size",
            x="message_bytes",
            y="time_s",
            group="algorithm",
            kind="scatter",
            log_x=True,
            log_y=True,
        ),
    ),
)
