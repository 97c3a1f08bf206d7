"""Tied embeddings across pipeline stages: the all-reduce of Megatron's "embedding group".

GPT-2 shares one V × h matrix E between its token embedding and its LM head (Press & Wolf,
2017, "Using the Output Embedding to Improve Language Models", arXiv 1608.05859), so its
gradient has two parts: ∂L/∂E = (∂L/∂E)_embedding + (∂L/∂E)_head. Cut into pipeline stages
(`impls.models.split_into_stages`), the first stage uses E as the embedding and the last
as the head; every rank builds the whole model from one seed, so the two ranks hold
bit-identical copies, but each backward fills only its own part. Megatron-LM (Shoeybi et
al., 2019, arXiv 1909.08053; Narayanan et al., 2021, arXiv 2104.04473) all-reduces E's
gradient over the *embedding group* — the first and the last pipeline stage's ranks — after
the pipeline's backward and before the optimizer, so both copies take the same step and stay
identical. That is what `EmbeddingGroup.all_reduce_gradients` does.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from impls.comm import Communicator, TrafficCounters
from impls.models.stages import Stage
from impls.pipeline.actions import COMPUTE_KINDS, Plan
from impls.pipeline.executor import PipelineExecutor

__all__ = ["EmbeddingGroup"]


class EmbeddingGroup:
    """The ranks holding a tied GPT's first stage (token embedding) and last stage (LM head).

    `first_rank` and `last_rank` are ranks of `comm` (the pipeline's communicator);
    `stage_modules` maps this rank's stage indices to the `Stage`s it holds, as given to
    `PipelineExecutor`. Checked on construction, before any message: on the pair's ranks
    the stages must include the first (last) stage of a tied GPT, and a rank holding both
    must hold them as one Parameter; every error is a ValueError naming the key. `weight`
    is this rank's tied Parameter, None on a rank outside the pair.

    Over a pair an all-reduce is one exchange: each rank sends its part and adds the one it
    receives (one round, V·h elements each way; a two-rank ring would take two rounds of half).
    Floating-point addition is commutative, so a + b on one rank and b + a on the other are
    bit-identical. When one rank holds both stages (P = 1, or a V-shaped placement whose rank 0
    holds the first and the last chunk), autograd already summed both parts into the one
    Parameter's `.grad`: nothing is sent. Ranks outside the pair do nothing.

        result = executor.step(inputs, targets)
        group.all_reduce_gradients()  # group = EmbeddingGroup.of_executor(executor), built once
        optimizer.step()
    """

    def __init__(
        self,
        comm: Communicator,
        stage_modules: Mapping[int, nn.Module],
        *,
        first_rank: int,
        last_rank: int,
    ) -> None:
        for key, value in (("first_rank", first_rank), ("last_rank", last_rank)):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"EmbeddingGroup: {key}={value!r} must be an int")
            if not 0 <= value < comm.world_size:
                raise ValueError(
                    f"EmbeddingGroup: {key}={value} must be a rank of the "
                    f"pipeline group, 0..{comm.world_size - 1}"
                )
        self.comm, self.first_rank, self.last_rank = comm, first_rank, last_rank
        stages = _checked_stages(stage_modules)
        held = []
        if comm.rank == first_rank:
            held.append(_tied_weight_of(stages, "first_rank", first_rank, last=False))
        if comm.rank == last_rank:
            held.append(_tied_weight_of(stages, "last_rank", last_rank, last=True))
        if len(held) == 2 and held[0] is not held[1]:
            raise ValueError(
                f"first_rank = last_rank = {first_rank}, but this rank's first and last stage "
                "hold two different tied Parameters: split them from one model"
            )
        self.weight: nn.Parameter | None = held[0] if held else None

    @classmethod
    def of_executor(cls, executor: PipelineExecutor) -> EmbeddingGroup:
        """The group of `executor`'s plan: the ranks that run the first and last stage."""
        last = executor.num_stages - 1
        return cls(
            executor.comm,
            executor.stage_modules,
            first_rank=_rank_running(executor.plan, 0),
            last_rank=_rank_running(executor.plan, last),
        )

    @property
    def peer(self) -> int | None:
        """The other rank of the pair, or None (outside the pair, or one rank holds both)."""
        if self.weight is None or self.first_rank == self.last_rank:
            return None
        return self.last_rank if self.comm.rank == self.first_rank else self.first_rank

    def all_reduce_gradients(self) -> TrafficCounters:
        """Sum the tied weight's `.grad` over the pair, in place; returns this rank's traffic.

        Call on every rank of the pipeline after the step's backward (the ranks outside the
        pair return at once). A missing `.grad` counts as zeros: the peer still needs it.
        """
        with self.comm.measure() as traffic:
            if self.weight is None:
                return traffic
            if self.weight.grad is None:
                self.weight.grad = torch.zeros_like(self.weight)
            peer = self.peer
            if peer is None:  # both parts already met in the one Parameter's .grad
                return traffic
            grad = self.weight.grad
            if not grad.is_contiguous():
                grad = self.weight.grad = grad.contiguous()
            received = self.comm.scratch(grad.numel(), grad.dtype)
            self.comm.count_call("all_reduce")
            with self.comm.round() as rnd:
                rnd.send(grad, peer)
                rnd.recv(received, peer)
            grad.add_(received.view_as(grad))  # mine + theirs: the same sum on both ranks
        return traffic


def _checked_stages(stage_modules: Mapping[int, nn.Module]) -> dict[int, Stage]:
    for index, module in stage_modules.items():
        if not isinstance(module, Stage):
            raise ValueError(
                f"stage_modules[{index}] is a {type(module).__name__}, not a Stage: the tied "
                "weight is found on the stages `impls.models.split_into_stages` returns"
            )
        if module.index != index:
            raise ValueError(f"stage_modules[{index}] is stage {module.index} of the model")
    return dict(stage_modules)


def _tied_weight_of(stages: dict[int, Stage], key: str, rank: int, *, last: bool) -> nn.Parameter:
    """This rank's first (last) stage's tied weight; the error names `key` otherwise."""
    role = "the last stage (the LM head)" if last else "the first stage (the token embedding)"
    found = [s for s in stages.values() if (s.is_last if last else s.is_first)]
    if not found:
        raise ValueError(f"{key}={rank}, but rank {rank} holds stages {sorted(stages)}, not {role}")
    stage = found[0]
    if stage.tied_weight is None:
        raise ValueError(
            f"stage {stage.index} holds {role} of a model that is not tied "
            "(GPTConfig.tie_embeddings=False, or not a GPT): there is no tied gradient to sum"
        )
    used = stage.lm_head.weight if last else stage.embedding.tok.weight
    if used is not stage.tied_weight:
        raise ValueError(
            f"stage {stage.index}'s {'lm_head' if last else 'embedding'} no longer holds the "
            "tied weight it was split with (replaced after split_into_stages?)"
        )
    return stage.tied_weight


def _rank_running(plan: Plan, stage: int) -> int:
    """The rank whose plan computes `stage` (any placement: read from the plan itself)."""
    ranks = [
        rank
        for rank, actions in plan.items()
        if any(a.stage == stage and a.kind in COMPUTE_KINDS for a in actions)
    ]
    if len(ranks) != 1:
        raise ValueError(f"stage {stage} is computed on ranks {ranks} of the plan, not on one")
    return ranks[0]
