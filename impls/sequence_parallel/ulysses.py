"""DeepSpeed-Ulysses attention (Jacobs et al. 2023, arXiv 2309.14509, §3).

Outside attention each of the P ranks holds a contiguous chunk of the sequence,
(b, s/P, h). Attention needs every position, so Ulysses re-partitions: after the local
q/k/v projections one all-to-all per tensor turns "s/P positions × all heads" into
"all s positions × nh/P heads", each rank runs ordinary causal attention on its heads, and
one all-to-all turns the context back into sequence chunks before the output projection.
That is 4 all-to-alls forward and 4 backward per layer; each moves b·(s/P)·h elements per
rank, so the volume per link falls as 1/P (§3.2), unlike Megatron-SP's all-gathers.

P must divide the head count (each rank takes whole heads). Sequence lengths that P does
not divide are end-padded by `common.shard_sequence`; the causal mask hides the padding.
Weights are replicated: sum their gradients with `all_reduce_replicated_grads`.
"""

from __future__ import annotations

import torch

from impls.collectives import all_to_all
from impls.comm import Communicator
from impls.models import CausalSelfAttention
from impls.models.gpt import attention_core
from impls.sequence_parallel.common import SequenceShardedAttention

__all__ = ["UlyssesAttention", "heads_to_seq", "seq_to_heads"]


def _seq_to_heads(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """(b, s/P, nh, hd) sequence chunk -> (b, s, nh/P, hd) head group, by one all-to-all."""
    p = comm.world_size
    b, chunk, nh, hd = x.shape
    # Block j of the send buffer is head group j: (b, s/P, P, nh/P, hd) -> (P, b, s/P, nh/P, hd)
    send = x.reshape(b, chunk, p, nh // p, hd).permute(2, 0, 1, 3, 4).contiguous()
    recv = torch.empty_like(send)
    all_to_all(recv, send, comm)
    # Block i of the receive buffer is sequence chunk i of our heads -> (b, P·s/P, nh/P, hd)
    return recv.permute(1, 0, 2, 3, 4).reshape(b, p * chunk, nh // p, hd)


def _heads_to_seq(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """(b, s, nh/P, hd) head group -> (b, s/P, nh, hd) sequence chunk; inverse of the above."""
    p = comm.world_size
    b, s, nh_local, hd = x.shape
    # Block j of the send buffer is sequence chunk j: (b, P, s/P, ...) -> (P, b, s/P, ...)
    send = x.reshape(b, p, s // p, nh_local, hd).transpose(0, 1).contiguous()
    recv = torch.empty_like(send)
    all_to_all(recv, send, comm)
    # Block i of the receive buffer is head group i of our chunk -> (b, s/P, P·nh/P, hd)
    return recv.permute(1, 2, 0, 3, 4).reshape(b, s // p, p * nh_local, hd)


class _Repartition(torch.autograd.Function):
    """One all-to-all forward; the inverse all-to-all backward (a permutation's adjoint)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, to_heads: bool) -> torch.Tensor:
        ctx.comm, ctx.to_heads = comm, to_heads
        return (_seq_to_heads if to_heads else _heads_to_seq)(x, comm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        inverse = _heads_to_seq if ctx.to_heads else _seq_to_heads
        return inverse(grad, ctx.comm), None, None


def seq_to_heads(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Differentiable (b, s/P, nh, hd) -> (b, s, nh/P, hd); identity when P = 1."""
    return x if comm.world_size == 1 else _Repartition.apply(x, comm, True)


def heads_to_seq(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Differentiable (b, s, nh/P, hd) -> (b, s/P, nh, hd); identity when P = 1."""
    return x if comm.world_size == 1 else _Repartition.apply(x, comm, False)


class UlyssesAttention(SequenceShardedAttention):
    """Ulysses attention over a sequence chunk; P must divide the number of heads."""

    def __init__(self, attn: CausalSelfAttention, comm: Communicator) -> None:
        n_heads = attn.q_proj.out_features // attn.head_dim
        if n_heads % comm.world_size:
            allowed = [p for p in range(1, n_heads + 1) if n_heads % p == 0]
            raise ValueError(
                f"Ulysses splits whole heads over ranks: n_heads={n_heads} is not divisible "
                f"by the sequence-parallel degree {comm.world_size}; allowed degrees: {allowed}"
            )
        super().__init__(attn, comm)

    def attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # 3 all-to-alls: (b, s/P, nh, hd) -> (b, s, nh/P, hd) -> (b, nh/P, s, hd)
        q, k, v = (seq_to_heads(t, self.comm).transpose(1, 2) for t in (q, k, v))
        # (b, nh/P, s, hd); selective recomputation keeps q, k, v only
        y = attention_core(q, k, v, attention=self.attention, recompute=self.recompute, dropout=0.0)
        # 1 all-to-all: (b, s, nh/P, hd) -> (b, s/P, nh, hd)
        return heads_to_seq(y.transpose(1, 2), self.comm)
