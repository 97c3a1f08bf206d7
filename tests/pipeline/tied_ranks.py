"""What the tied-embedding tests run *inside* pool ranks (module-level, so ranks can unpickle it).

Every rank of the pool calls these with the same arguments; the first P ranks form the
pipeline (a prefix sub-group) and the others return None at once.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

import torch
from torch import nn

from impls.comm import TrafficCounters
from impls.models import GPT, MLP, GPTConfig, MLPConfig, split_into_stages
from impls.pipeline.tied import EmbeddingGroup
from tests.pipeline.executor_ranks import Case, build_executor
from tests.rank_support import prefix_communicator

LR = 0.5  # large enough that a copy stepped with half its gradient differs visibly


@dataclass(frozen=True)
class TiedCase(Case):
    """The executor tests' `Case` with a tied GPT (M = 4 by default); `sync=False` is the
    negative control, which leaves each rank's part of the tied gradient unsummed."""

    microbatches: int = 4
    sync: bool = True

    def config(self, tie: bool = True) -> GPTConfig:
        return replace(super().config(), tie_embeddings=tie)


def reference(case: TiedCase) -> dict:
    """One process: the whole batch's mean loss, every gradient, the tied weight after SGD."""
    model = GPT(case.config(), seed=0)
    inputs, targets = case.batch()
    loss = GPT.loss(model(inputs), targets)
    loss.backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters()}
    torch.optim.SGD(model.parameters(), lr=LR).step()
    return {"loss": loss.detach(), "grads": grads, "stepped": model.embedding.tok.weight.detach()}


def run_tied(case: TiedCase) -> dict | None:
    """Step, sum the tied gradient over the embedding group, take one SGD step."""
    comm = prefix_communicator(case.stages)
    if comm is None:
        return None
    model, executor = build_executor(case, comm)
    mine = executor.stage_modules
    group = EmbeddingGroup.of_executor(executor)
    weight = group.weight
    initial = None if weight is None else weight.detach().clone()
    result = executor.step(*case.batch())
    traffic = group.all_reduce_gradients() if case.sync else TrafficCounters()
    params = list(nn.ModuleList(mine.values()).parameters())  # the tied one once
    held = {id(q) for q in params}
    grads = {n: q.grad.clone() for n, q in model.named_parameters() if id(q) in held}
    torch.optim.SGD(params, lr=LR).step()
    return {
        "loss": result.loss,
        "grads": grads,
        "pair": (group.first_rank, group.last_rank),
        "holds_tied": weight is not None,
        "initial": initial,
        "stepped": None if weight is None else weight.detach().clone(),
        "traffic": traffic,
        "calls": dict(comm.calls),
    }


def v_shaped_on_one_rank() -> dict | None:
    """Rank 0 holds the first and last of four stages (the V placement's rank 0): its tied
    weight's gradient, from a local backward of both, is summed already; nothing is sent."""
    comm = prefix_communicator(2)
    if comm is None:
        return None
    case = TiedCase("v", 2)
    model = GPT(case.config(), seed=0)
    stages = split_into_stages(model, 4)
    mine = {0: stages[0], 3: stages[3]} if comm.rank == 0 else {1: stages[1], 2: stages[2]}
    group = EmbeddingGroup(comm, mine, first_rank=0, last_rank=0)
    if comm.rank == 0:
        inputs, targets = case.batch()
        GPT.loss(model(inputs), targets).backward()
    traffic = group.all_reduce_gradients()
    return {
        "holds_tied": group.weight is not None,
        "grad": None if group.weight is None else group.weight.grad.clone(),
        "traffic": traffic,
    }


def misuse() -> list[str] | None:
    """Each misuse on two ranks, and what this rank raised ("ok": accepted); no messages."""
    comm = prefix_communicator(2)
    if comm is None:
        return None
    case = TiedCase("1f1b", 2)
    tied = split_into_stages(GPT(case.config(), seed=0), 2)
    other = split_into_stages(GPT(case.config(), seed=0), 2)
    untied = split_into_stages(GPT(case.config(tie=False), seed=0), 2)
    mlp = split_into_stages(
        MLP(MLPConfig(in_dim=4, hidden_dim=8, out_dim=2, n_layers=2), seed=0), 2
    )
    rank = comm.rank
    attempts = {
        "untied": ({rank: untied[rank]}, 0, 1),
        "mlp": ({rank: mlp[rank]}, 0, 1),
        "first on the wrong rank": ({rank: tied[rank]}, 1, 1),
        "last on the wrong rank": ({rank: tied[rank]}, 0, 0),
        "rank out of range": ({rank: tied[rank]}, 0, 2),
        "not a stage": ({rank: nn.Linear(2, 2)}, 0, 1),
        "two models on one rank": ({0: tied[0], 1: other[1]}, rank, rank),
    }
    errors = []
    for name, (modules, first, last) in attempts.items():
        try:
            EmbeddingGroup(comm, modules, first_rank=first, last_rank=last)
            errors.append(f"{name}: ok")
        except ValueError as err:
            errors.append(f"{name}: {err}")
    return errors
