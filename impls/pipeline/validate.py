"""Check a plan without running it: insert the transfers, then simulate every rank in lockstep.

`insert_communication` adds a receive before every compute action whose input lives on
another rank and a send after every one whose output is needed on another rank (see
`impls.pipeline.placement` for where exactly). `dry_run` steps all ranks together, one
action or one transfer round per rank per step, checks every dependency and detects
deadlock; on failure `PlanError` shows the step × rank grid with the offending cell marked
`[x]*`. No process starts and no tensor is allocated.
The transfer semantics a passing plan is safe under: `dry_run`.
"""

from __future__ import annotations

from dataclasses import dataclass

from impls.pipeline.actions import Action, Plan
from impls.pipeline.dataflow import StageRanks, placement_problem
from impls.pipeline.grid import render_grid
from impls.pipeline.lockstep import Lockstep, PlanError
from impls.pipeline.placement import adjacent_transfers, paired_transfers

__all__ = [
    "PLACEMENTS",
    "SEND_MODES",
    "DryRunResult",
    "PlanError",
    "dry_run",
    "insert_communication",
    "validate",
]

PLACEMENTS = ("paired", "adjacent")
SEND_MODES = ("rendezvous", "buffered")


@dataclass(frozen=True)
class DryRunResult:
    """A passing dry run: `cells[step][rank]` is what that rank completed in that step."""

    cells: tuple[tuple[str, ...], ...]
    placed: dict[Action, tuple[int, int]]  # compute action -> (step, rank) it ran at

    @property
    def steps(self) -> int:
        return len(self.cells)

    def grid(self) -> str:
        return render_grid(self.cells)


def insert_communication(
    plan: Plan,
    stages: int,
    virtual_stages: int = 1,
    placement: str = "paired",
    stage_ranks: StageRanks | None = None,
) -> Plan:
    """Return `plan` (compute actions only) with its `SEND_*` / `RECV_*` actions added.

    `stages` is the number of ranks P; the model has P·`virtual_stages` stages, stage s on
    rank `stage_ranks[s]` (default s % P). `placement="paired"` (default) puts both ends of
    each transfer at the same lockstep boundary, which cannot deadlock under rendezvous
    sends; if the compute order itself cannot finish, it falls back to `"adjacent"` (send
    right after the producer, receive right before the consumer) so that the dry run can
    show where it sticks.
    """
    _check_ranks(plan, stages)
    if placement not in PLACEMENTS:
        raise ValueError(f"placement={placement!r}: choose one of {', '.join(PLACEMENTS)}")
    for rank, actions in plan.items():
        comm = [a for a in actions if not a.is_compute]
        if comm:
            raise PlanError(f"{comm[0]} on rank {rank}: plan already has communication")
    num_stages = stages * virtual_stages
    _check_placement(plan, stages, num_stages, stage_ranks)
    paired = None
    if placement == "paired":
        paired = paired_transfers(plan, stages, num_stages, stage_ranks)
    if paired is not None:
        return paired
    return adjacent_transfers(plan, stages, num_stages, stage_ranks)


def dry_run(
    plan: Plan,
    stages: int | None = None,
    virtual_stages: int | None = None,
    sends: str = "rendezvous",
    stage_ranks: StageRanks | None = None,
) -> DryRunResult:
    """Simulate `plan` (with transfers) and return its step × rank grid, or raise PlanError.

    `stages` (ranks) defaults to the plan's rank count; `virtual_stages` to just enough to
    hold its highest stage. Each step every rank runs its next compute action (its inputs
    must already be on its rank) or waits on its current round; a step in which no rank
    moves, with work left, is a deadlock. At the end every forward must have met a full
    backward (`B`, or `I` then `W`) and every send its receive.

    Transfer semantics a passing plan is safe under (the executor must honour them):
    consecutive send/receive actions on a rank form one *round*, posted together and waited
    on together, like `impls.comm.Round`. By default each message is a rendezvous: a send
    completes only once the peer has posted the matching receive, and a receive once the peer
    has posted the matching send — gloo's behaviour, and the strictest usual one, so a plan
    that passes also runs with buffered sends. `sends="buffered"` models isend-and-forget
    instead: a send completes when posted and a receive when its send was posted. Messages are
    matched by what they carry; the dry run also requires each directed rank pair to send and
    receive its messages in the same order, so in-order transports (NCCL, untagged gloo) pair
    them identically.
    """
    ranks = len(plan) if stages is None else stages
    _check_ranks(plan, ranks)
    if sends not in SEND_MODES:
        raise ValueError(f"sends={sends!r}: choose one of {', '.join(SEND_MODES)}")
    if virtual_stages is None:
        top = max((a.stage for actions in plan.values() for a in actions), default=0)
        virtual_stages = top // ranks + 1
    _check_placement(plan, ranks, ranks * virtual_stages, stage_ranks)
    simulation = Lockstep(
        plan, ranks, ranks * virtual_stages, sends == "buffered", stage_ranks=stage_ranks
    )
    simulation.run()
    return DryRunResult(tuple(tuple(row) for row in simulation.cells), dict(simulation.placed))


def validate(
    plan: Plan,
    stages: int,
    microbatches: int,
    virtual_stages: int = 1,
    stage_ranks: StageRanks | None = None,
) -> DryRunResult:
    """`insert_communication` + `dry_run` + every (stage, micro-batch) present exactly once.

    `plan` holds compute actions only. Raises PlanError (with the grid) on any fault.
    """
    with_comm = insert_communication(plan, stages, virtual_stages, stage_ranks=stage_ranks)
    result = dry_run(with_comm, stages, virtual_stages, stage_ranks=stage_ranks)
    stray = [a for a in result.placed if a.microbatch >= microbatches]
    if stray:
        raise PlanError(
            f"{stray[0]} names micro-batch {stray[0].microbatch}, but microbatches={microbatches}",
            render_grid(result.cells, [result.placed[stray[0]]]),
        )
    missing = [
        str(Action(s, "F", m))
        for s in range(stages * virtual_stages)
        for m in range(microbatches)
        if Action(s, "F", m) not in result.placed
    ]
    if missing:
        shown = ", ".join(missing[:8]) + (" ..." if len(missing) > 8 else "")
        raise PlanError(f"{len(missing)} forwards never run: {shown}", result.grid())
    return result


def _check_ranks(plan: Plan, ranks: int) -> None:
    if sorted(plan) != list(range(ranks)):
        raise PlanError(f"plan has ranks {sorted(plan)}, expected 0..{ranks - 1} (stages={ranks})")


def _check_placement(
    plan: Plan, ranks: int, num_stages: int, stage_ranks: StageRanks | None = None
) -> None:
    """Every action must name a stage that exists and lives on the rank that lists it."""
    for rank in range(ranks):
        for index, action in enumerate(plan[rank]):
            problem = placement_problem(action, rank, ranks, num_stages, stage_ranks)
            if problem is not None:
                depth = max(len(actions) for actions in plan.values())
                cells = [
                    [str(plan[r][i]) if i < len(plan[r]) else "" for r in range(ranks)]
                    for i in range(depth)
                ]
                grid = render_grid(cells, [(index, rank)], row_label="index")
                raise PlanError(f"rank {rank}, position {index}: {problem}", grid)
