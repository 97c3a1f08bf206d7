"""`allreduce_scaling`'s typed config: every key, its default and its meaning.

Light on purpose: every rank unpickles this config, so it imports no pandas or plotting.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from bench.config import (
    bytes_key,
    check_choices,
    check_number,
    check_positive,
    iterations_key,
    seconds_key,
)
from bench.kit.collectives import TimedGridConfig
from impls.collectives import ALGORITHMS
from impls.collectives.algorithms import ORDER_COLUMNS

__all__ = ["ALLOWED", "AllReduceScalingConfig", "declared_columns"]

ALLOWED = [*ALGORITHMS, "auto", "torch"]


def declared_columns(algorithm: str) -> dict[str, object]:
    """What the report needs of an algorithm's spec, as columns of its rows (the report
    reads results only): `algorithm_rank`, its place in the registry, and
    `lecture_order_{rounds,peak,total}`, the lecture's O(·) ("" where the lecture gives
    none). Empty for `auto` and `torch`, which have no spec."""
    spec = ALGORITHMS.get(algorithm)
    if spec is None:
        return {"algorithm_rank": None, **{f"lecture_order_{c}": "" for c in ORDER_COLUMNS}}
    orders = spec.orders or {}
    return {
        "algorithm_rank": list(ALGORITHMS).index(algorithm),
        **{f"lecture_order_{c}": orders.get(c, "") for c in ORDER_COLUMNS},
    }


@dataclass(kw_only=True)
class AllReduceScalingConfig(TimedGridConfig):
    algorithms: list[str] = field(default_factory=lambda: list(ALLOWED))
    """All-reduce algorithms to compare; `auto` is the one a tuner calibrated on this pool
    predicts fastest per cell (`bench.kit.collectives.calibrated_tuner`); `torch` is
    torch.distributed.all_reduce."""
    message_bytes: list[int] = bytes_key([4 << 10 << 2 * i for i in range(8)])
    """Buffer sizes S in bytes (multiples of the dtype's size): 4 KiB … 64 MiB."""
    auto_repeats: int = iterations_key(48)
    """Rounds of an auto cell, in which auto, torch and each algorithm auto chooses from
    take one window in turn, and rounds per size of the tuner's calibration: judging auto
    against the best of six noisy sides needs more windows than a pairing with torch. 48
    completes the balanced orders of both (8 sides in a cell, 6 in the calibration)."""
    auto_window_s: float = seconds_key(0.02)
    """Target length of one window in those rounds (shorter than `window_s`: on a host
    whose speed drifts, many short rounds pair the sides more closely than a few long)."""

    def __post_init__(self) -> None:
        check_choices("algorithms", self.algorithms, ALLOWED)
        check_positive("auto_repeats", [self.auto_repeats])
        check_number("auto_window_s", self.auto_window_s)
        super().__post_init__()

    def auto_timing(self) -> tuple[float, int]:
        return self.auto_window_s, self.auto_repeats
