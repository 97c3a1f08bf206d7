"""The lockstep simulation behind `dry_run`: all ranks advance together, one item per step.

An *item* is a compute action or a round of consecutive transfers. Per step: ranks that
reached a round post its sends/receives; every message whose send and receive are both
posted is delivered (rendezvous); then each rank runs its compute action — which must find
every input already on its rank — or completes its round once all of the round's messages
were delivered, or waits. See `impls.pipeline.validate` for the semantics in full.
"""

from __future__ import annotations

from impls.pipeline.actions import Action, Plan
from impls.pipeline.dataflow import (
    Product,
    StageRanks,
    consumes,
    message_peer,
    partner,
    produces,
    rank_of,
    shipped,
)
from impls.pipeline.grid import WAITING, mark, render_grid

__all__ = ["Lockstep", "PlanError"]

Item = Action | tuple[Action, ...]
Message = tuple[Product, int, int]  # what, from rank, to rank


class PlanError(ValueError):
    """A plan that cannot run as written; `grid` is the dry run's step × rank picture."""

    def __init__(self, problem: str, grid: str = "") -> None:
        super().__init__(f"{problem}\n\n{grid}" if grid else problem)
        self.problem, self.grid = problem, grid


class Lockstep:
    """One dry run of a plan with transfers over `ranks` ranks and `num_stages` stages."""

    def __init__(
        self,
        plan: Plan,
        ranks: int,
        num_stages: int,
        buffered: bool = False,
        stage_ranks: StageRanks | None = None,
    ) -> None:
        self.ranks, self.num_stages, self.buffered = ranks, num_stages, buffered
        self.stage_ranks = stage_ranks
        self.items = [_items(plan[r]) for r in range(ranks)]
        self.position = [0] * ranks
        self.done: set[Action] = set()
        self.have: set[tuple[Product, int]] = set()
        self.placed: dict[Action, tuple[int, int]] = {}  # compute action -> (step, rank)
        self.cells: list[list[str]] = []
        self.posted: dict[str, dict[Message, tuple[int, Action]]] = {"send": {}, "recv": {}}
        self.seen: set[tuple[str, Message]] = set()
        self.delivered: set[tuple[int, Action]] = set()
        self.round_posted = [False] * ranks
        self.order: dict[tuple[int, Action], int] = {}  # transfer -> step its round ended

    def run(self) -> None:
        while any(self._current(r) is not None for r in range(self.ranks)):
            step, row = len(self.cells), [""] * self.ranks
            faults: list[tuple[int, str]] = []
            for r in range(self.ranks):
                if isinstance(self._current(r), tuple) and not self.round_posted[r]:
                    self._post(r, faults)
            self._deliver()
            moved = [self._advance(r, step, row, faults) for r in range(self.ranks)]
            self.cells.append(row)
            if faults:
                rank, problem = faults[0]
                marks = [(step, r) for r, _ in faults]
                raise PlanError(
                    f"step {step}, rank {rank}: {problem}", render_grid(self.cells, marks)
                )
            if not any(moved):
                self._deadlock()
        self._check_unreceived()
        self._check_backwards()
        self._check_channel_order()

    def _current(self, rank: int) -> Item | None:
        items = self.items[rank]
        return items[self.position[rank]] if self.position[rank] < len(items) else None

    def _post(self, rank: int, faults: list[tuple[int, str]]) -> None:
        for action in self._current(rank):
            role = "send" if action.kind.startswith("SEND") else "recv"
            problem = self._transfer_problem(rank, action)
            message = self._message(rank, action) if problem is None else None
            if problem is None and (role, message) in self.seen:
                problem = f"duplicate {action}: this message was already posted"
            if problem is not None:
                faults.append((rank, problem))
                continue
            self.seen.add((role, message))
            self.posted[role][message] = (rank, action)
        self.round_posted[rank] = True

    def _message(self, rank: int, action: Action) -> Message:
        peer = message_peer(action, self.ranks, self.stage_ranks)
        src, dst = (rank, peer) if action.kind.startswith("SEND") else (peer, rank)
        return (shipped(action), src, dst)

    def _transfer_problem(self, rank: int, action: Action) -> str | None:
        """Dynamic faults only: `dry_run` has already checked where each action sits."""
        product = shipped(action)
        if action.kind.startswith("SEND") and (product, rank) not in self.have:
            return f"{action} sends {product} before it was computed"
        return None

    def _deliver(self) -> None:
        sends, recvs = self.posted["send"], self.posted["recv"]
        for message in [m for m in sends if m in recvs]:
            self.delivered |= {sends.pop(message), recvs.pop(message)}
            self.have.add((message[0], message[2]))

    def _advance(self, rank: int, step: int, row: list[str], faults: list[tuple[int, str]]) -> bool:
        item = self._current(rank)
        if item is None:
            return False
        row[rank] = _label(item)
        if any(r == rank for r, _ in faults):
            return False
        if isinstance(item, Action):
            problem = self._compute_problem(rank, item)
            if problem is not None:
                faults.append((rank, problem))
                return False
            self._compute(rank, item, step)
        elif all(self._finished(rank, action) for action in item):
            for action in item:
                self.delivered.discard((rank, action))
                self.order[(rank, action)] = step
            self.round_posted[rank] = False
        else:
            row[rank] = WAITING
            return False
        self.position[rank] += 1
        return True

    def _finished(self, rank: int, action: Action) -> bool:
        """A buffered send is finished once posted; anything else once delivered."""
        buffered_send = self.buffered and action.kind.startswith("SEND")
        return buffered_send or (rank, action) in self.delivered

    def _compute(self, rank: int, action: Action, step: int) -> None:
        self.done.add(action)
        self.placed[action] = (step, rank)
        product = produces(action)
        if product is not None:
            self.have.add((product, rank))

    def _compute_problem(self, rank: int, action: Action) -> str | None:
        s, m = action.stage, action.microbatch
        if action in self.done:
            return f"duplicate {action}: it already ran at step {self.placed[action][0]}"
        split = {Action(s, k, m) for k in ("I", "W")} & self.done
        if (action.kind == "B" and split) or (
            action.kind == "I" and Action(s, "B", m) in self.done
        ):
            return f"{action} mixes a full backward B with a split one (I, W) for one micro-batch"
        if action.kind == "W" and Action(s, "I", m) not in self.done:
            return f"{action} runs before {Action(s, 'I', m)}, whose gradient it needs"
        for product in consumes(action, self.num_stages):
            if (product, rank) in self.have:
                continue
            source = rank_of(product.stage, self.ranks, self.stage_ranks)
            if source == rank:
                return f"{action} needs {product}, which has not been computed yet"
            return f"{action} needs {product} from rank {source}, which has not been received"
        return None

    def _deadlock(self) -> None:
        waits, stuck = [], [""] * self.ranks
        for rank in range(self.ranks):
            item = self._current(rank)
            if not isinstance(item, tuple):
                continue
            stuck[rank] = mark(_label(item))
            for action in item:
                if not self._finished(rank, action):
                    peer = message_peer(action, self.ranks, self.stage_ranks)
                    other = partner(action)
                    waits.append(f"rank {rank}'s {action} waits for {other} on rank {peer}")
        problem = f"deadlock at step {len(self.cells) - 1}: no rank can move; " + "; ".join(waits)
        raise PlanError(problem, render_grid(self.cells[:-1], blocked_row=stuck))

    def _check_backwards(self) -> None:
        unfinished = [
            a
            for a in sorted(self.done)
            if a.kind == "F"
            and Action(a.stage, "B", a.microbatch) not in self.done
            and Action(a.stage, "W", a.microbatch) not in self.done
        ]
        if unfinished:
            names = ", ".join(map(str, unfinished[:8]))
            raise PlanError(
                f"forwards without a complete backward (B, or I then W): {names}"
                + (" ..." if len(unfinished) > 8 else ""),
                render_grid(self.cells, [self.placed[a] for a in unfinished[:8]]),
            )

    def _check_unreceived(self) -> None:
        """With buffered sends a message can be sent and never received."""
        orphans = sorted(self.posted["send"].values())
        if orphans:
            rank, action = orphans[0]
            raise PlanError(
                f"{len(orphans)} messages are sent but never received, first {action} on rank "
                f"{rank}",
                render_grid(self.cells, [(self.order[(r, a)], r) for r, a in orphans[:8]]),
            )

    def _check_channel_order(self) -> None:
        """Each directed rank pair must send and receive its messages in the same order."""
        ends: dict[tuple[str, int, int], list[tuple[Message, int, int]]] = {}
        for rank in range(self.ranks):
            for item in self.items[rank]:
                for action in item if isinstance(item, tuple) else ():
                    _, src, dst = message = self._message(rank, action)
                    role = "send" if rank == src else "recv"
                    step = self.order[(rank, action)]
                    ends.setdefault((role, src, dst), []).append((message, step, rank))
        for (role, src, dst), sent in ends.items():
            if role != "send":
                continue
            for ours, theirs in zip(sent, ends[("recv", src, dst)], strict=True):
                if ours[0] != theirs[0]:
                    raise PlanError(
                        f"rank {src} sends {ours[0][0]} to rank {dst} where rank {dst} "
                        f"expects {theirs[0][0]}: both ends of a rank pair must post its "
                        "messages in one order, or an in-order transport (NCCL, untagged "
                        "gloo) pairs them wrongly",
                        render_grid(self.cells, [ours[1:], theirs[1:]]),
                    )


def _items(actions: list[Action]) -> list[Item]:
    """Group each run of consecutive transfer actions into one round."""
    items: list[Item] = []
    for action in actions:
        if action.is_comm and items and isinstance(items[-1], tuple):
            items[-1] = (*items[-1], action)
        else:
            items.append((action,) if action.is_comm else action)
    return items


def _label(item: Item) -> str:
    return "+".join(map(str, item)) if isinstance(item, tuple) else str(item)
