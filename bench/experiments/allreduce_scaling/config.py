"""`allreduce_scaling`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas or plotting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.config import check_choices
from bench.kit.collectives import TimedGridConfig
from impls.collectives import ALGORITHMS

__all__ = ["ALLOWED", "AllReduceScalingConfig"]

ALLOWED = [*ALGORITHMS, "auto", "torch"]


@dataclass(kw_only=True)
class AllReduceScalingConfig(TimedGridConfig):
    algorithms: list[str] = field(default_factory=lambda: list(ALLOWED))
    """All-reduce algorithms to compare; `auto` is the one a tuner calibrated on this pool
    predicts fastest per cell (`bench.kit.collectives.calibrated_tuner`); `torch` is
    torch.distributed.all_reduce."""
    message_bytes: list[int] = field(default_factory=lambda: [4 << 10 << 2 * i for i in range(8)])
    """Buffer sizes S in bytes (multiples of the dtype's size): 4 KiB … 64 MiB."""

    def __post_init__(self) -> None:
        check_choices("algorithms", self.algorithms, ALLOWED)
        super().__post_init__()
