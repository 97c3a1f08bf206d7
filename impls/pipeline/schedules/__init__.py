"""The schedule registry: one `ScheduleSpec` per name (declared in the schedule's own
file), `build_plan` that checks first, and the theory column `utilization_bound`.

Adding a schedule: write its file (builder and spec) and add its spec to `SCHEDULES`;
CONTRIBUTING.md walks through it.

`stages` is the pipeline degree P (one rank per stage); `virtual_stages` V > 1 only for
the interleaved schedule (any V ≥ 2, stage s on rank s % P) and ZB-V (V = 2, stages r and
2P−1−r on rank r); their model has P·V stages. `stage_ranks(name, …)` says where each
stage lives: None for round-robin, the `v_shape` tuple for ZB-V.
"""

from __future__ import annotations

from impls.pipeline.actions import Plan
from impls.pipeline.dataflow import StageRanks, v_shape
from impls.pipeline.schedules.gpipe import GPIPE, gpipe
from impls.pipeline.schedules.interleaved_1f1b import INTERLEAVED_1F1B, interleaved_1f1b
from impls.pipeline.schedules.naive import NAIVE, naive
from impls.pipeline.schedules.one_f_one_b import ONE_F_ONE_B, one_f_one_b
from impls.pipeline.schedules.spec import COUNTED_ON_PLAN, ScheduleSpec
from impls.pipeline.schedules.zero_bubble_h1 import ZERO_BUBBLE_H1, zero_bubble_h1
from impls.pipeline.schedules.zero_bubble_h2 import ZERO_BUBBLE_H2, zero_bubble_h2
from impls.pipeline.schedules.zero_bubble_v import ZERO_BUBBLE_V, zero_bubble_v

__all__ = [
    "COUNTED_ON_PLAN",
    "INTERLEAVED",
    "PLANNER_SCHEDULES",
    "SCHEDULES",
    "SPLIT_BACKWARD",
    "V_SHAPED",
    "ScheduleSpec",
    "build_plan",
    "gpipe",
    "interleaved_1f1b",
    "naive",
    "one_f_one_b",
    "schedule_spec",
    "stage_ranks",
    "utilization_bound",
    "zero_bubble_h1",
    "zero_bubble_h2",
    "zero_bubble_v",
]

# The registry: one line per schedule, in the order reports list them.
SCHEDULES: dict[str, ScheduleSpec] = {
    spec.name: spec
    for spec in (
        NAIVE,
        GPIPE,
        ONE_F_ONE_B,
        INTERLEAVED_1F1B,
        ZERO_BUBBLE_H1,
        ZERO_BUBBLE_H2,
        ZERO_BUBBLE_V,
    )
}
# The flag sets, read off the specs.
INTERLEAVED = frozenset(n for n, s in SCHEDULES.items() if s.chunks == "interleaved")
V_SHAPED = frozenset(n for n, s in SCHEDULES.items() if s.chunks == "v_shape")
SPLIT_BACKWARD = frozenset(n for n, s in SCHEDULES.items() if s.split_backward)  # I + W
PLANNER_SCHEDULES = tuple(n for n, s in SCHEDULES.items() if s.planner)
"""The schedules the planner searches (each spec opts in with `planner=True`)."""


def schedule_spec(name: str) -> ScheduleSpec:
    """The registered spec of schedule `name`; ValueError naming the choices otherwise."""
    if name not in SCHEDULES:
        raise ValueError(f"schedule={name!r}: unknown; choose one of {', '.join(SCHEDULES)}")
    return SCHEDULES[name]


def stage_ranks(name: str, stages: int, virtual_stages: int = 1) -> StageRanks | None:
    """Where schedule `name` puts each stage: None (stage s on rank s % P) or a tuple."""
    return v_shape(stages) if name in V_SHAPED else None


def build_plan(name: str, stages: int, microbatches: int, virtual_stages: int = 1) -> Plan:
    """Check the configuration, then build schedule `name`'s plan (`ScheduleSpec.plan`).

    Raises ValueError naming the offending key (`schedule`, `stages`, `microbatches`,
    `virtual_stages`) and what it allows, before anything is built.
    """
    return schedule_spec(name).plan(stages, microbatches, virtual_stages)


def utilization_bound(
    schedule: str, stages: int, microbatches: int, virtual_stages: int = 1
) -> float:
    """The theory column for a registered schedule: its spec's bubble bound (zero bubble:
    T_F = T_I = T_W, M ≥ P; ZB-H2 M ≥ 2P−1)."""
    return schedule_spec(schedule).utilization(stages, microbatches, virtual_stages)
