"""`collectives`' typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas or plotting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.config import bytes_key, check_choices
from bench.kit.collective_specs import COLLECTIVES
from bench.kit.collectives import TimedGridConfig

__all__ = ["IMPLS", "PRIMITIVES", "CollectivesConfig"]

# The order collectives are shown in; the grid is that list less all_reduce (which has its
# own experiment).
PRIMITIVES = [
    "broadcast",
    "reduce",
    "scatter",
    "gather",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
]
IMPLS = ["distbench", "torch"]


@dataclass(kw_only=True)
class CollectivesConfig(TimedGridConfig):
    collectives: list[str] = field(default_factory=lambda: list(PRIMITIVES))
    """Which collectives to time (all_reduce is allowed too: ring vs torch)."""
    impls: list[str] = field(default_factory=lambda: list(IMPLS))
    """distbench's implementation and/or torch.distributed's."""
    message_bytes: list[int] = bytes_key([64 << 10 << 2 * i for i in range(5)])
    """Sizes S as nccl-tests defines them per collective (64 KiB … 16 MiB); rounded down to N
    equal blocks where the collective splits S."""

    def __post_init__(self) -> None:
        check_choices("collectives", self.collectives, list(COLLECTIVES))
        check_choices("impls", self.impls, IMPLS)
        super().__post_init__()
