"""What the executor tests run *inside* pool ranks (module-level, so ranks can unpickle it).

Every rank of the pool calls these with the same arguments; the first P ranks form the
pipeline (a prefix sub-group) and the others return None at once.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from impls.models import GPT, GPTConfig, split_into_virtual_stages
from impls.pipeline import PipelineExecutor, build_plan
from impls.pipeline.dataflow import rank_of
from impls.pipeline.schedules import stage_ranks
from tests.rank_support import prefix_communicator

BATCH = 8


@dataclass(frozen=True)
class Case:
    """One pipeline run: schedule, P ranks, M micro-batches, V stages per rank, model size."""

    schedule: str
    stages: int
    microbatches: int
    virtual_stages: int = 1
    n_layers: int = 4
    d_model: int = 16
    seq_len: int = 8
    infer_shapes: bool = False  # let the executor learn activation shapes by messages
    recompute: str = "none"  # GPTConfig.recompute: none, selective or full

    def config(self) -> GPTConfig:
        return GPTConfig(
            vocab_size=32,
            seq_len=self.seq_len,
            d_model=self.d_model,
            n_heads=2,
            n_layers=self.n_layers,
            recompute=self.recompute,
        )

    def batch(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and next-token targets, (BATCH, seq_len) each, the same on every rank."""
        g = torch.Generator().manual_seed(1234)
        tokens = torch.randint(0, 32, (BATCH, self.seq_len + 1), generator=g)
        return tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous()


def build_executor(case: Case, comm) -> tuple[GPT, PipelineExecutor]:
    """Every rank builds the same GPT (seeded) and keeps its own stages of it."""
    p, v = case.stages, case.virtual_stages
    model = GPT(case.config(), seed=0)
    stages = split_into_virtual_stages(model, p, v)
    placed = stage_ranks(case.schedule, p, v)  # ZB-V: rank r holds stages r and 2P−1−r
    mine = {s: stages[s] for s in range(p * v) if rank_of(s, p, placed) == comm.rank}
    shape = None if case.infer_shapes else (BATCH // case.microbatches, case.seq_len, case.d_model)
    executor = PipelineExecutor(
        comm,
        mine,
        build_plan(case.schedule, p, case.microbatches, v),
        num_stages=p * v,
        microbatches=case.microbatches,
        loss_fn=GPT.loss,
        activation_shape=shape,
        stage_ranks=placed,
    )
    return model, executor


def run_steps(case: Case, steps: int = 1) -> dict | None:
    """Run `steps` steps (grads accumulate) and return what this rank measured."""
    comm = prefix_communicator(case.stages)
    if comm is None:
        return None
    model, executor = build_executor(case, comm)
    inputs, targets = case.batch()
    results = [executor.step(inputs, targets) for _ in range(steps)]
    return {
        "results": results,
        "grads": {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None},
        "owned": sorted(n for s in executor.stage_modules.values() for n, _ in _named(model, s)),
        "actions": [str(a) for a in executor.actions],
    }


def _named(model: GPT, module: torch.nn.Module):
    """`module`'s parameters under their names in the whole model."""
    ids = {id(p) for p in module.parameters()}
    return [(n, p) for n, p in model.named_parameters() if id(p) in ids]


def bad_inputs() -> list[str] | None:
    """Each misuse of the executor on two ranks, and the message it raised."""
    comm = prefix_communicator(2)
    if comm is None:
        return None
    case = Case("1f1b", 2, 4)
    model = GPT(case.config(), seed=0)
    stages = split_into_virtual_stages(model, 2, 1)
    mine = {comm.rank: stages[comm.rank]}
    plan = build_plan("1f1b", 2, 4)
    attempts = {
        "wrong stages": lambda: PipelineExecutor(
            comm, {0: stages[0], 1: stages[1]}, plan, num_stages=2, microbatches=4, loss_fn=GPT.loss
        ),
        "wrong ranks": lambda: PipelineExecutor(
            comm, mine, build_plan("1f1b", 4, 4), num_stages=2, microbatches=4, loss_fn=GPT.loss
        ),
        "missing micro-batch": lambda: PipelineExecutor(
            comm, mine, plan, num_stages=2, microbatches=5, loss_fn=GPT.loss
        ),
        "short placement": lambda: PipelineExecutor(
            comm, mine, plan, num_stages=2, microbatches=4, loss_fn=GPT.loss, stage_ranks=(0,)
        ),
        "V plan round-robin": lambda: PipelineExecutor(
            comm,
            {s: stages[0] for s in (comm.rank, 3 - comm.rank)},
            build_plan("zero_bubble_v", 2, 4, 2),
            num_stages=4,
            microbatches=4,
            loss_fn=GPT.loss,
        ),
    }
    errors = []
    for name, attempt in attempts.items():
        try:
            attempt()
            errors.append(f"{name}: accepted")
        except ValueError as err:
            errors.append(f"{name}: {err}")
    executor = PipelineExecutor(comm, mine, plan, num_stages=2, microbatches=4, loss_fn=GPT.loss)
    inputs, targets = case.batch()
    for name, args in {"no inputs": (None, None), "indivisible": (inputs[:6], targets[:6])}.items():
        try:  # both ranks fail before any message is sent, so neither blocks
            executor.step(*args)
            errors.append(f"{name}: accepted")
        except ValueError as err:
            errors.append(f"{name}: {err}")
    return errors
