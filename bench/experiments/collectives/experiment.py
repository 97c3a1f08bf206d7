"""`collectives`: the nccl-tests table for every primitive, distbench's implementation
beside torch.distributed's, with algbw, busbw and `wrong`."""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.config import check_choices
from bench.experiments.base import Cell, Experiment
from bench.experiments.collectives import report
from bench.kit.collective_specs import COLLECTIVES
from bench.kit.collectives import (
    DTYPE_BYTES,
    CollectiveCall,
    TimedGridConfig,
    collective_row,
    measure_collective,
)

__all__ = ["EXPERIMENT", "CollectivesConfig"]

# The report owns the order collectives are shown in; the grid is that list less
# all_reduce (which has its own experiment), so the two cannot drift apart.
PRIMITIVES = [c for c in report.COLLECTIVE_ORDER if c != "all_reduce"]
IMPLS = ["distbench", "torch"]


@dataclass(kw_only=True)
class CollectivesConfig(TimedGridConfig):
    collectives: list[str] = field(default_factory=lambda: list(PRIMITIVES))
    """Which collectives to time (all_reduce is allowed too: ring vs torch)."""
    impls: list[str] = field(default_factory=lambda: list(IMPLS))
    """distbench's implementation and/or torch.distributed's."""
    message_bytes: list[int] = field(default_factory=lambda: [64 << 10 << 2 * i for i in range(5)])
    """Sizes S as nccl-tests defines them per collective (64 KiB … 16 MiB); rounded down to N
    equal blocks where the collective splits S."""

    def __post_init__(self) -> None:
        check_choices("collectives", self.collectives, list(COLLECTIVES))
        check_choices("impls", self.impls, IMPLS)
        super().__post_init__()


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
)
