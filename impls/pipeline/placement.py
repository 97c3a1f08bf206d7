"""Where the sends and receives go: two placements of the transfers a plan needs.

`adjacent`: each send right after the action that produced its tensor and each receive
right before the action that consumes it — what torch.distributed.pipelining does, and
safe when sends are buffered, but able to deadlock under rendezvous sends (interleaved
1F1B does: every rank can be sending a gradient to a neighbour that is itself sending).

`paired`: first run the compute actions alone in lockstep (one per rank per step, each as
soon as its inputs exist), then put both ends of every transfer into a round at the same
step boundary — right after the producing step. Rounds at boundary b contain only
messages whose other end is also at boundary b, and every rank reaches its boundary-b
round using only tensors delivered at earlier boundaries, so by induction over b every
round completes: the plan cannot deadlock even under rendezvous sends. This is the
Megatron-LM habit of batching a step's sends and receives together, derived per plan.
"""

from __future__ import annotations

from impls.pipeline.actions import Action, Plan
from impls.pipeline.dataflow import StageRanks, consumer_stage, consumes, produces, rank_of

__all__ = ["adjacent_transfers", "compute_steps", "paired_transfers"]


def _send(action: Action) -> Action:
    return Action(action.stage, "SEND_F" if action.kind == "F" else "SEND_B", action.microbatch)


def _recv(action: Action, consumer: int) -> Action:
    return Action(consumer, "RECV_F" if action.kind == "F" else "RECV_B", action.microbatch)


def adjacent_transfers(
    plan: Plan, ranks: int, num_stages: int, stage_ranks: StageRanks | None = None
) -> Plan:
    """Receive right before the consumer, send right after the producer."""
    out: Plan = {}
    for rank, actions in plan.items():
        placed: list[Action] = []
        for action in actions:
            for product in consumes(action, num_stages):
                if rank_of(product.stage, ranks, stage_ranks) != rank:
                    kind = "RECV_F" if product.kind == "activation" else "RECV_B"
                    placed.append(Action(action.stage, kind, action.microbatch))
            placed.append(action)
            consumer = consumer_stage(action, num_stages)
            if consumer is not None and rank_of(consumer, ranks, stage_ranks) != rank:
                placed.append(_send(action))
        out[rank] = placed
    return out


def compute_steps(
    plan: Plan, ranks: int, num_stages: int, stage_ranks: StageRanks | None = None
) -> dict[int, list[int]] | None:
    """The lockstep step of each compute action, or None if the order cannot finish.

    Each step every rank runs its next action if its inputs exist: produced on this rank
    at an earlier step, or on another rank at an earlier step (delivered at the boundary
    right after it). An action on the wrong rank or a missing producer makes it stick.
    """
    position = {r: 0 for r in plan}
    steps: dict[int, list[int]] = {r: [] for r in plan}
    available: dict[tuple[object, int], int] = {}  # (product, rank) -> first step it can be used
    step = 0
    while any(position[r] < len(plan[r]) for r in plan):
        runnable = []
        for r in plan:
            if position[r] < len(plan[r]):
                action = plan[r][position[r]]
                needs = consumes(action, num_stages)
                if rank_of(action.stage, ranks, stage_ranks) == r and all(
                    available.get((p, r), step + 1) <= step for p in needs
                ):
                    runnable.append((r, action))
        if not runnable:
            return None
        for r, action in runnable:
            steps[r].append(step)
            position[r] += 1
            product, consumer = produces(action), consumer_stage(action, num_stages)
            if product is not None:
                available[(product, r)] = step + 1
                if consumer is not None:
                    available[(product, rank_of(consumer, ranks, stage_ranks))] = step + 1
        step += 1
    return steps


def paired_transfers(
    plan: Plan, ranks: int, num_stages: int, stage_ranks: StageRanks | None = None
) -> Plan | None:
    """Both ends of each transfer at the boundary after the producing step (None if stuck)."""
    steps = compute_steps(plan, ranks, num_stages, stage_ranks)
    if steps is None:
        return None
    keyed: dict[int, list[tuple[tuple[int, int, int], Action]]] = {r: [] for r in plan}
    for rank, actions in plan.items():
        for index, (action, step) in enumerate(zip(actions, steps[rank], strict=True)):
            keyed[rank].append(((step, 0, index), action))
            consumer = consumer_stage(action, num_stages)
            if consumer is not None and rank_of(consumer, ranks, stage_ranks) != rank:
                # Sorts after every compute of `step` and before any of step + 1.
                keyed[rank].append(((step, 1, index), _send(action)))
                keyed[rank_of(consumer, ranks, stage_ranks)].append(
                    ((step, 2, rank), _recv(action, consumer))
                )
    return {rank: [action for _, action in sorted(keyed[rank])] for rank in plan}
