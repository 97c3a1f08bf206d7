"""What every sequence-parallel method shares: cutting a sequence into per-rank chunks,
putting it back together, and summing the gradients of replicated weights.

Uneven lengths are handled by padding at the *end* of the sequence, so every rank holds
`ceil(seq_len / P)` positions. All three methods here are causal, and a padded position
sits after every real one, so no real query ever attends a padded key: the causal mask
already hides the padding and no extra mask is needed. Padded queries do produce outputs;
`gather_sequence` drops them, so their gradients are zero and they touch nothing real.
"""

from __future__ import annotations

import abc
import copy
import math
from typing import Self

import torch
import torch.nn.functional as F
from torch import nn

from impls.collectives import all_gather, all_reduce
from impls.comm import Communicator
from impls.models import CausalSelfAttention

__all__ = [
    "SequenceShardedAttention",
    "all_reduce_replicated_grads",
    "gather_sequence",
    "local_seq_len",
    "shard_sequence",
]


def local_seq_len(seq_len: int, world_size: int) -> int:
    """Positions each rank holds for a `seq_len`-long sequence: ceil(seq_len / P)."""
    if not isinstance(seq_len, int) or seq_len < 1:
        raise ValueError(f"seq_len must be a positive int, got {seq_len!r}")
    return math.ceil(seq_len / world_size)


def shard_sequence(x: torch.Tensor, comm: Communicator, dim: int = 1) -> torch.Tensor:
    """This rank's chunk of `x` along `dim`, end-padded with zeros to P equal chunks."""
    seq_len, p = x.shape[dim], comm.world_size
    chunk = local_seq_len(seq_len, p)
    pad = chunk * p - seq_len
    if pad:
        dim = dim % x.dim()
        # F.pad lists (before, after) pairs from the last dim backwards.
        x = F.pad(x, [0, 0] * (x.dim() - 1 - dim) + [0, pad])
    return x.narrow(dim, comm.rank * chunk, chunk).contiguous()


def gather_sequence(
    local: torch.Tensor, comm: Communicator, seq_len: int, dim: int = 1
) -> torch.Tensor:
    """The whole `seq_len`-long sequence from every rank's chunk (padding dropped).

    Not differentiable: it is how callers and tests look at a result, not a layer.
    """
    chunk = local_seq_len(seq_len, comm.world_size)
    if local.shape[dim] != chunk:
        raise ValueError(
            f"seq_len={seq_len} over P={comm.world_size} ranks means chunks of {chunk} "
            f"positions, but the local tensor has {local.shape[dim]} along dim {dim}"
        )
    dim = dim % local.dim()
    out = torch.empty((comm.world_size, *local.shape), dtype=local.dtype, device=local.device)
    all_gather(out, local.detach().contiguous(), comm)
    return out.movedim(0, dim).flatten(dim, dim + 1).narrow(dim, 0, seq_len)


def all_reduce_replicated_grads(params: list[nn.Parameter], comm: Communicator) -> None:
    """Sum, over the sequence-parallel group, the gradients of weights every rank holds.

    A replicated weight sees only this rank's positions, so its local gradient is a
    partial sum over the sequence; the full gradient is the sum over ranks (Megatron-SP
    does this for LayerNorm weights, Korthikanti et al. 2022 §4.2.2; Ulysses and Ring
    Attention for every weight, as data parallelism over sequence chunks would).
    """
    for param in params:
        if param.grad is not None and comm.world_size > 1:
            all_reduce(param.grad, comm, op="sum")


class SequenceShardedAttention(nn.Module, abc.ABC):
    """Causal self-attention on this rank's sequence chunk: (b, s/P, h) -> (b, s/P, h).

    The projections are per position, so each rank applies full (replicated) copies of a
    `CausalSelfAttention`'s four projections to its own positions; a subclass's `attend`
    supplies what crosses chunks. Weight gradients are partial sums over positions: sum
    them over the group with `all_reduce_replicated_grads(self.replicated_parameters())`.
    """

    def __init__(self, attn: CausalSelfAttention, comm: Communicator) -> None:
        super().__init__()
        if attn.dropout:
            raise ValueError(
                f"dropout={attn.dropout}: attention dropout is not supported (allowed: 0.0)"
            )
        self.comm = comm
        self.head_dim = attn.head_dim
        self.attention, self.recompute = attn.attention, attn.recompute
        self.q_proj, self.k_proj, self.v_proj = attn.q_proj, attn.k_proj, attn.v_proj
        self.o_proj = attn.o_proj

    @classmethod
    def from_attention(cls, attn: CausalSelfAttention, comm: Communicator) -> Self:
        """A layer with its own copy of `attn`'s weights."""
        return cls(copy.deepcopy(attn), comm)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Every weight: each rank holds them whole and sees only its positions."""
        return list(self.parameters())

    @abc.abstractmethod
    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        """(b, s/P, nh, hd) chunks of q, k, v -> the chunk's (b, s/P, nh, hd) context."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, chunk, _ = x.shape
        # (b, s/P, h) @ (h, h) -> (b, s/P, nh, hd), all heads of our positions
        q, k, v = (
            proj(x).view(b, chunk, -1, self.head_dim)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        y = self.attend(q, k, v).reshape(b, chunk, -1)  # (b, s/P, h)
        return self.o_proj(y)  # (b, s/P, h) @ (h, h) -> (b, s/P, h)
