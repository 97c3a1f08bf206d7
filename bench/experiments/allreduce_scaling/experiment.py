"""Experiment `allreduce_scaling`: every all-reduce algorithm × world size × message size,
with torch.distributed.all_reduce as the baseline (the lecture's comparison table)."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.collective_specs import COLLECTIVES
from bench.experiments.common import (
    Cell,
    Experiment,
    TimedGridConfig,
    check_choices,
    collective_row,
)
from bench.reports import allreduce_scaling as report
from bench.timing import CollectiveCell, measure_collective
from impls.collectives import ALGORITHMS

__all__ = ["EXPERIMENT", "AllReduceScalingConfig"]

ALLOWED = [*ALGORITHMS, "torch"]


@dataclass(kw_only=True)
class AllReduceScalingConfig(TimedGridConfig):
    algorithms: list[str] = field(default_factory=lambda: list(ALLOWED))
    """All-reduce algorithms to compare; `torch` is torch.distributed.all_reduce."""
    message_bytes: list[int] = field(default_factory=lambda: [4 << 10 << 2 * i for i in range(8)])
    """Buffer sizes S in bytes (multiples of the dtype's size)."""

    def __post_init__(self) -> None:
        check_choices("algorithms", self.algorithms, ALLOWED)
        super().__post_init__()


def cells(cfg: AllReduceScalingConfig) -> list[Cell]:
    return [
        Cell(
            world_size=n,
            key={"algorithm": alg, "world_size": n, "message_bytes": m, "dtype": cfg.dtype},
            fn=measure_collective,
            task=CollectiveCell(
                collective="all_reduce",
                impl="torch" if alg == "torch" else "distbench",
                algorithm=alg if alg != "torch" else "ring",
                message_bytes=m,
                **cfg.timing(),
            ),
        )
        for n in cfg.world_sizes
        for alg in cfg.algorithms
        for m in cfg.message_bytes
    ]


def to_row(cell: Cell, per_rank: list[dict]) -> dict:
    factor = COLLECTIVES["all_reduce"].bus_factor(cell.world_size)
    return collective_row(cell, per_rank, factor, traffic=cell.key["algorithm"] != "torch")


EXPERIMENT = Experiment(
    name="allreduce_scaling",
    schema=AllReduceScalingConfig,
    key_columns=["algorithm", "world_size", "message_bytes", "dtype"],
    cells=cells,
    to_row=to_row,
    write_report=report.write_report,
)
