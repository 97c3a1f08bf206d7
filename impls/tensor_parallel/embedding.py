"""Vocabulary-parallel embedding, LM head and cross-entropy (Megatron-LM, arXiv 1909.08053,
§3, "input embedding" and "output embedding").

Rank r holds vocab rows [r·V/t, (r+1)·V/t) of the token embedding. A token id outside that
range looks up nothing (its row is zeroed), so summing the ranks' lookups with `g` gives
the full embedding. The LM head, column-parallel over the same vocabulary split, yields
logits (b, s, V/t) per rank; the cross-entropy then needs only per-token scalars across
ranks — the max logit (for a stable softmax), the sum of exponentials and the target's
logit — instead of gathering the (b, s, V) logits.
"""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from impls.collectives import all_reduce
from impls.comm import Communicator
from impls.tensor_parallel.layers import ColumnParallelLinear, check_divisible, shard
from impls.tensor_parallel.ops import reduce_from_tp

__all__ = ["VocabParallelEmbedding", "parallel_lm_head", "vocab_parallel_cross_entropy"]


class VocabParallelEmbedding(nn.Module):
    """An `nn.Embedding` whose rows (token ids) are split over the TP group."""

    tp_shard_dims: ClassVar[dict[str, int]] = {"weight": 0}

    def __init__(self, weight: torch.Tensor, vocab_start: int, comm: Communicator) -> None:
        super().__init__()
        self.weight = nn.Parameter(weight)
        self.vocab_start = vocab_start
        self.vocab_end = vocab_start + weight.shape[0]
        self.comm = comm

    @classmethod
    def from_module(cls, embedding: nn.Embedding, comm: Communicator) -> VocabParallelEmbedding:
        """This rank's vocab rows of a full `embedding` (identical on every rank)."""
        t, r = comm.world_size, comm.rank
        check_divisible("vocab_size", embedding.num_embeddings, t)
        rows = embedding.num_embeddings // t
        return cls(shard(embedding.weight, 0, r, t), r * rows, comm)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        outside = (idx < self.vocab_start) | (idx >= self.vocab_end)
        local = (idx - self.vocab_start).masked_fill(outside, 0)
        rows = F.embedding(local, self.weight)  # (b, s) -> (b, s, h), wrong rows where outside
        rows = rows.masked_fill(outside.unsqueeze(-1), 0.0)
        return reduce_from_tp(rows, self.comm)  # exactly one rank contributed each token

    def extra_repr(self) -> str:
        return f"vocab=[{self.vocab_start}, {self.vocab_end}), tp={self.comm.world_size}"


def parallel_lm_head(linear: nn.Linear, comm: Communicator) -> ColumnParallelLinear:
    """The LM head split over the vocabulary like `VocabParallelEmbedding`: logits (b, s, V/t)."""
    check_divisible("vocab_size", linear.out_features, comm.world_size)
    return ColumnParallelLinear.from_linear(linear, comm, gather_output=False)


def vocab_parallel_cross_entropy(
    logits_shard: torch.Tensor, targets: torch.Tensor, comm: Communicator
) -> torch.Tensor:
    """Mean cross-entropy over every position from vocab-sharded logits, on every rank.

    `logits_shard` is (..., V/t): rank r's contiguous vocab block r. loss = log Σ_v e^{z_v − m}
    − (z_target − m) with m the global max; the max is a constant of the gradient (it
    cancels), so it is all-reduced without autograd, and the per-token sum of exponentials
    and target logit are summed over ranks together in one all-reduce through `g`, whose
    identity backward gives each rank the gradient of its own terms.
    """
    part = logits_shard.shape[-1]
    start = comm.rank * part
    # (..., V/t) -> (...): the global max logit per token
    max_logit = logits_shard.detach().amax(dim=-1)
    if comm.world_size > 1:
        all_reduce(max_logit, comm, op="max")
    shifted = logits_shard - max_logit.unsqueeze(-1)
    outside = (targets < start) | (targets >= start + part)
    local = (targets - start).masked_fill(outside, 0)
    target_logit = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
    partial = torch.stack([shifted.exp().sum(dim=-1), target_logit], dim=-1)  # (..., 2)
    sum_exp, target_logit = reduce_from_tp(partial, comm).unbind(-1)
    return (sum_exp.log() - target_logit).mean()
