"""The schedule's replay compiled once into a dependency graph, then evaluated in one pass.

`impls.pipeline.replay.replay` places every action by sweeping the ranks until nothing
moves; it is the reference. The simulator calls it thousands of times per search with the
same schedule and different costs, so here the plan is compiled once (cached per schedule,
pp, M, V) into a topological order of its compute actions, each with the action before it on
its rank and the products it waits for (local, or one transfer away). Evaluating a step is
then one pass of longest-path arithmetic: start = max(the rank's previous end, each input's
arrival), end = start + duration. Because every rank runs its list in order and a product
is ready at a time fixed by its producer, this gives the reference's spans exactly
(`tests/simulator/test_timeline.py` pins makespan, busy time and each rank's end).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import lru_cache

from impls.pipeline.dataflow import consumes, produces, rank_of
from impls.pipeline.schedules import build_plan, stage_ranks

__all__ = ["CompiledSchedule", "FastTimeline", "compile_schedule", "evaluate"]

KIND_INDEX = {"F": 0, "I": 1, "W": 2, "B": 3}
"""Column of each compute kind in the duration table a stage gives: (F, I, W, B)."""


@dataclass(frozen=True)
class CompiledSchedule:
    """Compute actions in a topological order, as parallel tuples (index = position)."""

    ranks: int
    plan: dict
    """The schedule itself (rank -> actions), for the memory walk."""
    rank: tuple[int, ...]
    stage: tuple[int, ...]
    kind: tuple[int, ...]
    previous: tuple[int, ...]
    """Position of the action before it on its rank, or −1."""
    inputs: tuple[tuple[tuple[int, int, int], ...], ...]
    """Per action: (producer position, producer stage, 0 local / 1 via SEND_F / 2 via SEND_B)."""


@dataclass(frozen=True)
class FastTimeline:
    makespan: float
    busy: tuple[float, ...]
    ends: tuple[float, ...]
    """When each rank's last action ends."""


@lru_cache(maxsize=512)
def compile_schedule(
    name: str, pp: int, microbatches: int, virtual_stages: int
) -> CompiledSchedule:
    """Build the plan with `build_plan` and order its compute actions (Kahn's algorithm)."""
    plan = build_plan(name, pp, microbatches, virtual_stages)
    stages = pp * virtual_stages
    placed = stage_ranks(name, pp, virtual_stages)
    actions = [(r, a) for r in range(pp) for a in plan[r] if a.is_compute]
    producer = {}
    for i, (_, a) in enumerate(actions):
        product = produces(a)
        if product is not None:
            producer[product] = i
    previous, inputs = [-1] * len(actions), []
    last_on_rank: dict[int, int] = {}
    for i, (r, a) in enumerate(actions):
        previous[i] = last_on_rank.get(r, -1)
        last_on_rank[r] = i
        needs = []
        for product in consumes(a, stages):
            j = producer[product]
            source = actions[j][1]
            via = 0 if rank_of(source.stage, pp, placed) == r else (1 if source.kind == "F" else 2)
            needs.append((j, source.stage, via))
        inputs.append(tuple(needs))
    order = _topological(previous, inputs)
    position = {old: new for new, old in enumerate(order)}
    return CompiledSchedule(
        ranks=pp,
        plan=plan,
        rank=tuple(actions[i][0] for i in order),
        stage=tuple(actions[i][1].stage for i in order),
        kind=tuple(KIND_INDEX[actions[i][1].kind] for i in order),
        previous=tuple(position[previous[i]] if previous[i] >= 0 else -1 for i in order),
        inputs=tuple(tuple((position[j], s, via) for j, s, via in inputs[i]) for i in order),
    )


def _topological(previous: list[int], inputs: list[tuple]) -> list[int]:
    """Kahn's order over the edges previous -> i and producer -> i; refuses a cycle."""
    waiting = [0] * len(previous)
    after: list[list[int]] = [[] for _ in previous]
    for i, prev in enumerate(previous):
        for j in ([prev] if prev >= 0 else []) + [j for j, _, _ in inputs[i]]:
            waiting[i] += 1
            after[j].append(i)
    ready = [i for i, n in enumerate(waiting) if n == 0]
    order = []
    while ready:
        i = ready.pop()
        order.append(i)
        for k in after[i]:
            waiting[k] -= 1
            if waiting[k] == 0:
                ready.append(k)
    if len(order) != len(previous):
        raise ValueError("schedule cannot finish: its actions wait on each other in a cycle")
    return order


def evaluate(
    compiled: CompiledSchedule,
    durations: Sequence[Sequence[float]],
    send_forward: Sequence[float] | None = None,
    send_backward: Sequence[float] | None = None,
) -> FastTimeline:
    """Replay with `durations[stage][KIND_INDEX[kind]]` and the per-stage send costs (None:
    free transfers)."""
    n = len(compiled.rank)
    end = [0.0] * n
    busy = [0.0] * compiled.ranks
    ends = [0.0] * compiled.ranks
    sends: tuple[Sequence[float] | None, ...] = (None, send_forward, send_backward)
    rank, stage, kind, previous, inputs = (
        compiled.rank,
        compiled.stage,
        compiled.kind,
        compiled.previous,
        compiled.inputs,
    )
    for i in range(n):
        prev = previous[i]
        start = end[prev] if prev >= 0 else 0.0
        for j, source, via in inputs[i]:
            ready = end[j]
            table = sends[via]
            if table is not None:
                ready += table[source]
            if ready > start:
                start = ready
        cost = durations[stage[i]][kind[i]]
        end[i] = start + cost
        r = rank[i]
        busy[r] += cost
        if end[i] > ends[r]:
            ends[r] = end[i]
    return FastTimeline(makespan=max(ends, default=0.0), busy=tuple(busy), ends=tuple(ends))
