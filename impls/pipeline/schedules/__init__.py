"""The schedule registry: one pure plan builder per name, and `build_plan` that checks first.

`stages` is the pipeline degree P (one rank per stage); `virtual_stages` V > 1 only for
the interleaved schedule, whose model then has P·V stages, stage s on rank s % P.
"""

from __future__ import annotations

from collections.abc import Callable

from impls.pipeline.actions import Plan
from impls.pipeline.schedules._checks import ONE_CHUNK, require_count
from impls.pipeline.schedules.gpipe import gpipe
from impls.pipeline.schedules.interleaved_1f1b import interleaved_1f1b
from impls.pipeline.schedules.naive import naive
from impls.pipeline.schedules.one_f_one_b import one_f_one_b
from impls.pipeline.schedules.zero_bubble_h1 import zero_bubble_h1

__all__ = [
    "INTERLEAVED",
    "SCHEDULES",
    "build_plan",
    "gpipe",
    "interleaved_1f1b",
    "naive",
    "one_f_one_b",
    "zero_bubble_h1",
]

SCHEDULES: dict[str, Callable[..., Plan]] = {
    "naive": naive,
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved_1f1b": interleaved_1f1b,
    "zero_bubble_h1": zero_bubble_h1,
}
INTERLEAVED = frozenset({"interleaved_1f1b"})  # schedules that take virtual_stages >= 2


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
    if virtual_stages != 1:
        raise ValueError(
            f"virtual_stages={virtual_stages!r}: schedule {name!r} puts one stage on each "
            f"rank, so virtual_stages must be 1 (only {', '.join(sorted(INTERLEAVED))} "
            "takes more)"
        )
    return SCHEDULES[name](stages, microbatches)
