"""The schedule registry: one pure plan builder per name, and `build_plan` that checks first.

`stages` is the pipeline degree P (one rank per stage); `virtual_stages` V > 1 only for
the interleaved schedule (any V ≥ 2, stage s on rank s % P) and ZB-V (V = 2, stages r and
2P−1−r on rank r); their model has P·V stages. `stage_ranks(name, …)` says where each
stage lives: None for round-robin, the `v_shape` tuple for ZB-V.
"""

from __future__ import annotations

from collections.abc import Callable

from impls.pipeline.actions import Plan
from impls.pipeline.dataflow import StageRanks, v_shape
from impls.pipeline.schedules._checks import ONE_CHUNK, require_count
from impls.pipeline.schedules.gpipe import gpipe
from impls.pipeline.schedules.interleaved_1f1b import interleaved_1f1b
from impls.pipeline.schedules.naive import naive
from impls.pipeline.schedules.one_f_one_b import one_f_one_b
from impls.pipeline.schedules.zero_bubble_h1 import zero_bubble_h1
from impls.pipeline.schedules.zero_bubble_h2 import zero_bubble_h2
from impls.pipeline.schedules.zero_bubble_v import zero_bubble_v

__all__ = [
    "INTERLEAVED",
    "SCHEDULES",
    "SPLIT_BACKWARD",
    "V_SHAPED",
    "build_plan",
    "gpipe",
    "interleaved_1f1b",
    "naive",
    "one_f_one_b",
    "stage_ranks",
    "zero_bubble_h1",
    "zero_bubble_h2",
    "zero_bubble_v",
]

SCHEDULES: dict[str, Callable[..., Plan]] = {
    "naive": naive,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "zero_bubble_h1": zero_bubble_h1,
    "zero_bubble_h2": zero_bubble_h2,
    "zero_bubble_v": zero_bubble_v,
}
INTERLEAVED = frozenset({"interleaved_1f1b"})  # schedules that take virtual_stages >= 2
V_SHAPED = frozenset({"zero_bubble_v"})  # two chunks per rank, in a V
SPLIT_BACKWARD = frozenset({"zero_bubble_h1", "zero_bubble_h2", "zero_bubble_v"})  # I + W
# Schedules whose plan (and bound) needs microbatches >= stages.
NEEDS_M_GE_P = frozenset({"zero_bubble_h2", "zero_bubble_v"})


def stage_ranks(name: str, stages: int, virtual_stages: int = 1) -> StageRanks | None:
    """Where schedule `name` puts each stage: None (stage s on rank s % P) or a tuple."""
    return v_shape(stages) if name in V_SHAPED else None


def build_plan(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Plan:
    """Check the configuration, then build schedule `name`'s plan.

    Raises ValueError naming the offending key (`schedule`, `stages`, `microbatches`,
    `virtual_stages`) and what it allows, before anything is built.
    """
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r}: unknown; choose one of {', '.join(SCHEDULES)}")
    require_count("stages", stages)
    require_count("microbatches", microbatches)
    if name in INTERLEAVED:
        require_count("virtual_stages", virtual_stages, 2, ONE_CHUNK)
        return SCHEDULES[name](stages, microbatches, virtual_stages)
    if name in NEEDS_M_GE_P and microbatches < stages:
        raise ValueError(
            f"microbatches={microbatches!r}: schedule {name!r} needs microbatches >= "
            f"stages={stages} (its warm-up fills the pipeline with micro-batches)"
        )
    if name in V_SHAPED:
        return SCHEDULES[name](stages, microbatches, virtual_stages)
    if virtual_stages != 1:
        raise ValueError(
            f"virtual_stages={virtual_stages!r}: schedule {name!r} puts one stage on each "
            f"rank, so virtual_stages must be 1 (only {', '.join(sorted(INTERLEAVED))} "
            "takes more, and zero_bubble_v exactly 2)"
        )
    return SCHEDULES[name](stages, microbatches)
