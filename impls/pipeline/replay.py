"""Replay a plan on an ideal machine: each rank its own device, costs given per action.

This is the "replayed" timeline of the design: given how long each compute action takes
and what each transfer costs, every action starts as soon as its rank is free and every
product it consumes is available — locally when the producing action has ended, on another
rank one transfer later. Nothing is executed and no process starts; with F = 1, B = 2 and
free transfers it reproduces the textbook numbers (naive 4 stages: 25%, GPipe 4×4: 4/7).
Sends are treated as non-blocking here: the replay measures the schedule's own bubble,
not a transport's rendezvous waits (those show up in the wall-clock timeline instead).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from impls.pipeline.actions import Action, Plan
from impls.pipeline.dataflow import StageRanks, consumer_stage, consumes, produces, rank_of
from impls.pipeline.lockstep import PlanError

__all__ = ["ActionSpan", "Timeline", "max_inflight_microbatches", "replay"]

Durations = Mapping[str, float] | Mapping[Action, float] | Callable[[Action], float]
TransferCost = float | Mapping[Action, float] | Callable[[Action], float]


@dataclass(frozen=True)
class ActionSpan:
    """When one action ran on one rank (seconds from the start of the step)."""

    rank: int
    action: Action
    start: float
    end: float


@dataclass(frozen=True)
class Timeline:
    """A replayed step: every compute action's span, the makespan and per-rank busy time."""

    spans: tuple[ActionSpan, ...]
    makespan: float
    busy: tuple[float, ...]

    @property
    def utilization(self) -> float:
        """Σ busy / (P × makespan): the fraction of rank-time spent computing."""
        if self.makespan <= 0:
            return 0.0
        return sum(self.busy) / (len(self.busy) * self.makespan)

    @property
    def bubble_fraction(self) -> float:
        return 1.0 - self.utilization


def replay(
    plan: Plan,
    durations: Durations,
    transfer: TransferCost = 0.0,
    num_stages: int | None = None,
    stage_ranks: StageRanks | None = None,
) -> Timeline:
    """Place `plan`'s compute actions on a timeline, each rank running its list in order.

    `durations` gives each compute action's seconds: a callable, or a mapping keyed by
    `Action` or by kind (`{"F": 1, "B": 2}`). `transfer` is the cost of moving one product
    between ranks: a number, or a mapping/callable keyed by the send action
    (`Action(s, "SEND_F", m)` for stage s's activation, `Action(s, "SEND_B", m)` for its
    input gradient). Communication actions in `plan` are skipped: `transfer` prices them.
    Stage s lives on rank `stage_ranks[s]` (default s % P); `num_stages` defaults to the
    highest stage in the plan + 1.
    Transfers never contend with each other or with compute (each pair of ranks has its own
    link and its own copy engine). Raises PlanError if the order can never finish.
    """
    ranks = len(plan)
    queues = {r: [a for a in plan[r] if a.is_compute] for r in range(ranks)}
    if num_stages is None:
        num_stages = 1 + max((a.stage for q in queues.values() for a in q), default=0)
    ready_at: dict[tuple[object, int], float] = {}  # (product, rank) -> time available
    clock, busy = [0.0] * ranks, [0.0] * ranks
    spans: list[ActionSpan] = []
    position = [0] * ranks
    progressed = True
    while progressed:
        progressed = False
        for r in range(ranks):
            while position[r] < len(queues[r]):
                action = queues[r][position[r]]
                needs = [ready_at.get((p, r)) for p in consumes(action, num_stages)]
                if any(t is None for t in needs):
                    break
                start = max([clock[r], *needs])
                end = start + _cost(durations, action)
                spans.append(ActionSpan(r, action, start, end))
                clock[r], busy[r] = end, busy[r] + (end - start)
                _publish(action, r, end, (ranks, num_stages, stage_ranks), transfer, ready_at)
                position[r] += 1
                progressed = True
    stuck = {r: str(queues[r][position[r]]) for r in range(ranks) if position[r] < len(queues[r])}
    if stuck:
        raise PlanError(f"plan cannot finish: these ranks wait forever on {stuck}")
    spans.sort(key=lambda span: (span.start, span.rank))
    return Timeline(tuple(spans), max(clock, default=0.0), tuple(busy))


def _publish(
    action: Action,
    rank: int,
    end: float,
    layout: tuple[int, int, StageRanks | None],
    transfer: TransferCost,
    ready_at: dict[tuple[object, int], float],
) -> None:
    """Record when `action`'s product is available on its own rank and on its consumer's."""
    ranks, num_stages, stage_ranks = layout
    product = produces(action)
    if product is None:
        return
    ready_at[(product, rank)] = end
    consumer = consumer_stage(action, num_stages)
    to = None if consumer is None else rank_of(consumer, ranks, stage_ranks)
    if to is not None and to != rank:
        send = Action(action.stage, "SEND_F" if action.kind == "F" else "SEND_B", action.microbatch)
        ready_at[(product, to)] = end + _cost(transfer, send)


def _cost(table: Durations | TransferCost, action: Action) -> float:
    if callable(table):
        return float(table(action))
    if isinstance(table, Mapping):
        for key in (action, action.kind):
            if key in table:
                return float(table[key])
        raise KeyError(f"no duration for {action} (neither the action nor kind {action.kind!r})")
    return float(table)


def max_inflight_microbatches(plan: Plan) -> dict[int, int]:
    """Per rank, the most micro-batches whose activations are held at once.

    Walking each rank's list in order, (stage, micro-batch) becomes held at its forward `F`
    and stops being held after its full backward `B`, or after `W` when the backward is
    split (the weight gradient still needs the stage's saved inputs). The count includes
    the forward just issued, so 1F1B's rank 0 reports min(P, M) and GPipe's every rank M.
    With virtual stages each held pair is one chunk, 1/V of the rank's layers.
    """
    peaks: dict[int, int] = {}
    for rank, actions in plan.items():
        held: set[tuple[int, int]] = set()
        peak = 0
        for action in actions:
            key = (action.stage, action.microbatch)
            if action.kind == "F":
                held.add(key)
                peak = max(peak, len(held))
            elif action.kind in ("B", "W"):
                held.discard(key)
        peaks[rank] = peak
    return peaks
