"""What each action consumes and produces: the one statement of pipeline dependencies.

A forward of stage s consumes stage s−1's activation of the same micro-batch; a backward
(`B`, or its input half `I`) of stage s consumes its own forward's activation and the
gradient stage s+1 passed back; `W` consumes what `I` left behind. Communication moves a
product between the ranks that hold neighbouring stages. By default stage s lives on rank
s % P, so with V virtual stages per rank, rank r holds stages r, r+P, …, r+(V−1)P
(Megatron-LM's interleaved placement); a schedule may place its stages otherwise with a
`stage_ranks` tuple (stage -> rank), e.g. ZB-V's V shape, `v_shape`. `validate` and
`replay` both read their dependencies from here.
"""

from __future__ import annotations

from dataclasses import dataclass

from impls.pipeline.actions import Action

__all__ = [
    "Product",
    "StageRanks",
    "consumer_stage",
    "consumes",
    "message_peer",
    "partner",
    "placement_problem",
    "produces",
    "rank_of",
    "round_robin",
    "shipped",
    "v_shape",
]

StageRanks = tuple[int, ...]
"""stage -> the rank that holds it; None wherever one is accepted means `round_robin`."""

# Which neighbour a transfer talks to: stage s's SEND_F goes to s+1, its RECV_F from s−1, …
_PEER_STEP = {"SEND_F": 1, "RECV_F": -1, "SEND_B": -1, "RECV_B": 1}


@dataclass(frozen=True)
class Product:
    """A tensor a stage hands on: `"activation"` (forward output) or `"gradient"` (input grad)."""

    kind: str
    stage: int
    microbatch: int

    def __str__(self) -> str:
        return f"stage {self.stage}'s {self.kind} of micro-batch {self.microbatch}"


def round_robin(ranks: int, num_stages: int) -> StageRanks:
    """Stage s on rank s % P: one stage per rank, or Megatron-LM's interleaving."""
    return tuple(s % ranks for s in range(num_stages))


def v_shape(ranks: int) -> StageRanks:
    """2P stages, rank r holding stages r and 2P−1−r: rank 0 has the first and the last.

    The V-shaped placement of Qi et al. 2024 ("Pipeline Parallelism with Controllable
    Memory", ZB-V): the forward goes down the ranks and comes back up, so stage P−1 hands
    its activation to stage P on the same rank, and the loss is computed on rank 0.
    """
    return tuple(range(ranks)) + tuple(reversed(range(ranks)))


def rank_of(stage: int, ranks: int, stage_ranks: StageRanks | None = None) -> int:
    """The rank that holds `stage`: `stage_ranks[stage]`, or round-robin (s % P) by default."""
    return stage % ranks if stage_ranks is None else stage_ranks[stage]


def consumes(action: Action, num_stages: int) -> list[Product]:
    """The products a compute action needs on its own rank before it can run."""
    s, m = action.stage, action.microbatch
    if action.kind == "F":
        return [Product("activation", s - 1, m)] if s > 0 else []
    if action.kind in ("B", "I"):
        needs = [Product("activation", s, m)]
        if s < num_stages - 1:
            needs.append(Product("gradient", s + 1, m))
        return needs
    if action.kind == "W":
        return [Product("gradient", s, m)]
    raise ValueError(f"{action} is not a compute action")


def produces(action: Action) -> Product | None:
    """The product a compute action leaves on its rank (`W` only updates weight grads)."""
    if action.kind == "F":
        return Product("activation", action.stage, action.microbatch)
    if action.kind in ("B", "I"):
        return Product("gradient", action.stage, action.microbatch)
    return None


def consumer_stage(action: Action, num_stages: int) -> int | None:
    """The other stage that consumes a compute action's product, or None (last F, first B, W)."""
    if action.kind == "F":
        return action.stage + 1 if action.stage + 1 < num_stages else None
    if action.kind in ("B", "I"):
        return action.stage - 1 if action.stage > 0 else None
    return None


def shipped(action: Action) -> Product:
    """The product a send/receive action moves (named by the sender's or receiver's stage)."""
    s, m = action.stage, action.microbatch
    return {
        "SEND_F": Product("activation", s, m),
        "RECV_F": Product("activation", s - 1, m),
        "SEND_B": Product("gradient", s, m),
        "RECV_B": Product("gradient", s + 1, m),
    }[action.kind]


def message_peer(action: Action, ranks: int, stage_ranks: StageRanks | None = None) -> int:
    """The rank on the other end of a send/receive action."""
    return rank_of(action.stage + _PEER_STEP[action.kind], ranks, stage_ranks)


def partner(action: Action) -> Action:
    """The transfer at the other end: `0SEND_F3` <-> `1RECV_F3`, `1SEND_B0` <-> `0RECV_B0`."""
    direction, what = action.kind.split("_")
    other = "RECV" if direction == "SEND" else "SEND"
    return Action(action.stage + _PEER_STEP[action.kind], f"{other}_{what}", action.microbatch)


def placement_problem(
    action: Action, rank: int, ranks: int, num_stages: int, stage_ranks: StageRanks | None = None
) -> str | None:
    """Why `action` cannot appear in `rank`'s list at all, or None if it can."""
    if not 0 <= action.stage < num_stages:
        return f"{action}: stage {action.stage} does not exist (stages 0..{num_stages - 1})"
    home = rank_of(action.stage, ranks, stage_ranks)
    if home != rank:
        return f"{action} belongs on rank {home}, not rank {rank}"
    if action.is_comm:
        peer_stage = action.stage + _PEER_STEP[action.kind]
        if not 0 <= peer_stage < num_stages:
            return f"{action} has no partner: stage {peer_stage} does not exist"
        if rank_of(peer_stage, ranks, stage_ranks) == rank:
            return f"{action} transfers to its own rank: stage {peer_stage} is local"
    return None
