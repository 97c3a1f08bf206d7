"""The executor's messages: the plan with its transfers, grouped into rounds, each message
sized by its stage boundary and paired across ranks by its tag.

A round is a run of consecutive `SEND_*`/`RECV_*` actions in a rank's list: the executor
posts them together and waits on them together, the semantics under which the dry run
(`impls.pipeline.validate`) proved the plan free of deadlock, gloo's rendezvous sends
included.
"""

from __future__ import annotations

from impls.pipeline.actions import Action, Plan
from impls.pipeline.dataflow import StageRanks
from impls.pipeline.validate import dry_run, insert_communication, validate

__all__ = ["Segment", "boundary", "message_tag", "segments", "with_transfers"]

Segment = Action | tuple[Action, ...]
"""One compute action, or one round of transfers."""


def with_transfers(
    plan: Plan,
    ranks: int,
    microbatches: int,
    virtual: int,
    stage_ranks: StageRanks | None = None,
) -> Plan:
    """Validate `plan` and return it with its transfers (inserted unless already there)."""
    has_transfers = any(a.is_comm for actions in plan.values() for a in actions)
    compute_only = {r: [a for a in actions if a.is_compute] for r, actions in plan.items()}
    validate(compute_only, ranks, microbatches, virtual, stage_ranks)
    if not has_transfers:
        return insert_communication(plan, ranks, virtual, stage_ranks=stage_ranks)
    dry_run(plan, ranks, virtual, stage_ranks=stage_ranks)
    return plan


def segments(actions: list[Action]) -> list[Segment]:
    """Compute actions one by one; each run of consecutive transfers as one round."""
    result: list[Segment] = []
    pending: list[Action] = []
    for action in actions:
        if action.is_comm:
            pending.append(action)
            continue
        if pending:
            result.append(tuple(pending))
            pending = []
        result.append(action)
    if pending:
        result.append(tuple(pending))
    return result


def boundary(action: Action) -> int:
    """The stage whose output the transfer carries (or the gradient of it)."""
    return action.stage - 1 if action.kind in ("RECV_F", "SEND_B") else action.stage


def message_tag(action: Action, microbatches: int) -> int:
    """The same tag at both ends, distinct per message, so no pairing relies on order."""
    gradient = int(action.kind.endswith("_B"))
    return (boundary(action) * microbatches + action.microbatch) * 2 + gradient
