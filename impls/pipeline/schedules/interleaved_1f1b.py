"""Interleaved 1F1B: Megatron-LM's schedule with V virtual stages (model chunks) per rank.

Narayanan et al. 2021, "Efficient Large-Scale Language Model Training on GPU Clusters"
(SC'21), §2.2.2. The model is cut into P·V stages and rank r holds stages r, r+P, …,
r+(V−1)P, so each micro-batch visits every rank V times. Each action then does 1/V of a
rank's work, and the fill/drain ramps shrink by the same factor: the bubble falls from
(P−1)/M to (P−1)/(V·M) of the ideal time, at the price of V times more messages.

Micro-batches move through a rank in groups of P (hence M must be a multiple of P): the
k-th forward a rank runs belongs to chunk (k // P) mod V and micro-batch
(k // (P·V))·P + k mod P; backwards walk the chunks in reverse. Rank r warms up with
2(P−r−1) + (V−1)·P forwards (capped at M·V; all of them when M = P, as Megatron-LM does),
then alternates one forward and one backward, then drains the remaining backwards.
"""

from __future__ import annotations

from impls.pipeline.actions import Action, Plan
from impls.pipeline.schedules._checks import ONE_CHUNK, require_count
from impls.pipeline.schedules.spec import ScheduleSpec
from impls.pipeline.theory import interleaved_utilization

__all__ = ["INTERLEAVED_1F1B", "interleaved_1f1b", "interleaved_1f1b_inflight"]


def interleaved_1f1b(stages: int, microbatches: int, virtual_stages: int = 2) -> Plan:
    """Rank r's actions over stages r, r+P, …: warm-up, 1F1B steady state, cool-down."""
    require_count("stages", stages)
    require_count("microbatches", microbatches)
    require_count("virtual_stages", virtual_stages, 2, ONE_CHUNK)
    if microbatches % stages:
        raise ValueError(
            f"microbatches={microbatches}: schedule 'interleaved_1f1b' needs microbatches "
            f"divisible by stages={stages} (micro-batches pass through each rank in groups "
            "of P)"
        )
    total = microbatches * virtual_stages
    plan: Plan = {}
    for rank in range(stages):
        if microbatches == stages:
            warmup = total
        else:
            warmup = min(2 * (stages - rank - 1) + (virtual_stages - 1) * stages, total)
        forwards = [_nth(k, rank, stages, virtual_stages, "F") for k in range(total)]
        backwards = [_nth(k, rank, stages, virtual_stages, "B") for k in range(total)]
        actions = forwards[:warmup]
        for k in range(total - warmup):
            actions += [forwards[warmup + k], backwards[k]]
        plan[rank] = actions + backwards[total - warmup :]
    return plan


def _nth(k: int, rank: int, stages: int, virtual_stages: int, kind: str) -> Action:
    """The k-th forward (or backward) that `rank` runs, in Megatron-LM's order."""
    chunk = (k // stages) % virtual_stages
    if kind == "B":
        chunk = virtual_stages - 1 - chunk
    microbatch = (k // (stages * virtual_stages)) * stages + k % stages
    return Action(chunk * stages + rank, kind, microbatch)


def interleaved_1f1b_inflight(stages: int, microbatches: int, virtual_stages: int) -> list[int]:
    """Rank r its warm-up 2(P − r − 1) + (V − 1)P plus the forward just issued, capped at
    M·V; all M·V when M = P (Megatron-LM's warm-up, as `interleaved_1f1b` builds it)."""
    total = microbatches * virtual_stages
    if microbatches == stages:
        return [total] * stages
    warmup = [2 * (stages - r - 1) + (virtual_stages - 1) * stages for r in range(stages)]
    return [min(w + 1, total) for w in warmup]


INTERLEAVED_1F1B = ScheduleSpec(
    name="interleaved_1f1b",
    build=interleaved_1f1b,
    label="interleaved 1F1B",
    utilization=interleaved_utilization,
    bound_source="M/(M+(P−1)/V) — Narayanan et al. 2021 (Megatron-LM), §2.2.2",
    inflight=interleaved_1f1b_inflight,
    marker="^",
    chunks="interleaved",
    planner=True,
)
