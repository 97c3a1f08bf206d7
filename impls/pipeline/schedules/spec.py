"""A pipeline schedule, declared once: `ScheduleSpec` holds everything the rest of distbench
knows about it (builder, report label, bubble bound, in-flight count, flags, marker,
whether the planner searches it). Each schedule's file declares its spec next to its
builder; `impls.pipeline.schedules.SCHEDULES` lists them, and every consumer (plan checks,
theory column, planner bounds and space, reports) reads the spec, never a list of names.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from typing import Literal

from impls.pipeline.actions import Plan
from impls.pipeline.replay import max_inflight_microbatches
from impls.pipeline.schedules._checks import ONE_CHUNK, require_count

__all__ = ["CHUNKS", "COUNTED_ON_PLAN", "ScheduleSpec"]

CHUNKS = ("one", "interleaved", "v_shape")
"""How a schedule places model chunks: one stage per rank; V ≥ 2 chunks round-robin
(stage s on rank s % P); exactly two chunks in a V (stages r and 2P−1−r on rank r)."""
COUNTED_ON_PLAN = "counted on the plan"
"""`ScheduleSpec.inflight` for list-scheduled orders with no closed form per rank: the
count is read off the built plan (`impls.pipeline.replay.max_inflight_microbatches`)."""

InFlight = Callable[[int, int, int], Sequence[int]]


@dataclass(frozen=True, kw_only=True)
class ScheduleSpec:
    """One pipeline schedule and what every consumer needs to know about it."""

    name: str
    """The key in configs, plans and results (`schedule=1f1b`)."""
    build: Callable[..., Plan]
    """The pure plan builder: (stages, microbatches), or (stages, microbatches,
    virtual_stages) when `chunks` is not "one"."""
    label: str
    """How reports and figures name it ("1F1B")."""
    utilization: Callable[[int, int, int], float]
    """The bubble bound: utilization with equal stage costs and free transfers, as a
    function of (P, M, V) (`impls.pipeline.theory`)."""
    bound_source: str
    """The bound as reports print it: "formula — paper, section"."""
    inflight: InFlight | Literal["counted on the plan"]
    """Per rank, the most (stage, micro-batch) pairs held at once, (P, M, V) -> P counts,
    or `COUNTED_ON_PLAN`. The planner's memory bound reads it."""
    marker: str
    """Its matplotlib marker in the reports' figures."""
    chunks: Literal["one", "interleaved", "v_shape"] = "one"
    split_backward: bool = False
    """The backward is split into I (input gradient) and W (weight gradient) actions."""
    needs_m_ge_p: bool = False
    """Its warm-up fills the pipeline with micro-batches, so it needs M ≥ P."""
    microbatched: bool = True
    """False for a schedule that runs one micro-batch per step (naive)."""
    planner: bool = False
    """The planner searches it (opt-in: a new schedule is not searched until its in-flight
    count and the simulator's layout are known to hold for it)."""

    def plan(self, stages: int, microbatches: int, virtual_stages: int = 1) -> Plan:
        """Check the configuration, then build the plan.

        Raises ValueError naming the offending key (`stages`, `microbatches`,
        `virtual_stages`) and what it allows, before anything is built.
        """
        require_count("stages", stages)
        require_count("microbatches", microbatches)
        if self.chunks == "interleaved":
            require_count("virtual_stages", virtual_stages, 2, ONE_CHUNK)
            return self.build(stages, microbatches, virtual_stages)
        if self.needs_m_ge_p and microbatches < stages:
            raise ValueError(
                f"microbatches={microbatches!r}: schedule {self.name!r} needs microbatches >= "
                f"stages={stages} (its warm-up fills the pipeline with micro-batches)"
            )
        if self.chunks == "v_shape":
            return self.build(stages, microbatches, virtual_stages)
        if virtual_stages != 1:
            raise ValueError(
                f"virtual_stages={virtual_stages!r}: schedule {self.name!r} puts one stage on "
                "each rank, so virtual_stages must be 1 (only the interleaved schedules take "
                "more, and the V-shaped ones exactly 2)"
            )
        return self.build(stages, microbatches)

    def held(self, stages: int, microbatches: int, virtual_stages: int = 1) -> list[int]:
        """`inflight` evaluated: per rank, the most pairs held at once."""
        if self.inflight == COUNTED_ON_PLAN:
            return list(_counted(self, stages, microbatches, virtual_stages))
        return list(self.inflight(stages, microbatches, virtual_stages))


@lru_cache(maxsize=256)
def _counted(
    spec: ScheduleSpec, stages: int, microbatches: int, virtual_stages: int
) -> tuple[int, ...]:
    counts = max_inflight_microbatches(spec.plan(stages, microbatches, virtual_stages))
    return tuple(counts[r] for r in range(stages))
