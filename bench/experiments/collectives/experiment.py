"""`collectives`: the nccl-tests table for every primitive, distbench's implementation
beside torch.distributed's, with algbw, busbw and `wrong`."""

from __future__ import annotations

from bench.charts import Chart
from bench.experiments.base import Cell, Experiment
from bench.experiments.collectives import report
from bench.experiments.collectives.config import CollectivesConfig
from bench.kit.collective_specs import COLLECTIVES
from bench.kit.collectives import (
    DTYPE_BYTES,
    CollectiveCall,
    collective_row,
    measure_collective,
)

__all__ = ["EXPERIMENT", "CollectivesConfig"]


def _size(name: str, message_bytes: int, n: int, dtype: str) -> int:
    """S rounded down to what the collective can use (N whole blocks of elements)."""
    if not COLLECTIVES[name].block_divides:
        return message_bytes
    unit = n * DTYPE_BYTES[dtype]
    return message_bytes // unit * unit


def cells(cfg: CollectivesConfig) -> list[Cell]:
    """Every (N, collective, impl, S), N ascending (the runner reuses one pool per N)."""
    out = []
    for n in sorted(set(cfg.world_sizes)):
        for name in cfg.collectives:
            for impl in cfg.impls:
                for m in cfg.message_bytes:
                    size = _size(name, m, n, cfg.dtype)
                    key = {"collective": name, "impl": impl, "world_size": n}
                    key |= {"message_bytes": size, "dtype": cfg.dtype}
                    call = CollectiveCall(name, impl)
                    out.append(Cell(world_size=n, key=key, fn=measure_collective, carry=call))
    return out


def to_row(cfg: CollectivesConfig, cell: Cell, per_rank: list[dict]) -> dict:
    return collective_row(cell, per_rank, traffic=cell.key["impl"] == "distbench")


EXPERIMENT = Experiment(
    name="collectives",
    summary="the nccl-tests table: every collective, distbench vs torch.distributed",
    schema=CollectivesConfig,
    key_columns=("collective", "impl", "world_size", "message_bytes", "dtype"),
    cells=cells,
    to_row=to_row,
    report=report.REPORT,
    charts=(
        Chart(
            title="Bus bandwidth against message size",
            x="message_bytes",
            y="busbw_gbps",
            group="impl",
            kind="scatter",
            log_x=True,
        ),
        Chart(
            title="distbench busbw ÷ torch, per collective",
            x="collective",
            y="busbw_vs_torch",
            kind="bar",
        ),
    ),
)
