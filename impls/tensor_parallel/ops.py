"""The communication operators of Megatron tensor and sequence parallelism, as autograd ops.

Megatron-LM (Shoeybi et al., arXiv 1909.08053, Fig. 3) names two conjugate operators:
`f` is the identity in forward and an all-reduce of the gradient in backward (it sits where
a replicated activation enters a tensor-parallel region); `g` is an all-reduce in forward
and the identity in backward (where partial results leave the region). The gather/scatter
pair moves a tensor between "split along a dim" and "replicated"; the sequence-parallel pair
(Korthikanti et al., arXiv 2205.05198, §4.2.2) replaces `g` by a reduce-scatter along the
sequence and `f` by an all-gather, so that the regions between TP blocks hold 1/t of the
sequence.

Every operator runs on `impls.collectives` over the TP group's `Communicator`, so its
traffic lands in that communicator's counters. Collectives exchange dim-0 blocks of a
contiguous buffer: an operator along another dim moves that dim to the front first.
"""

from __future__ import annotations

import torch

from impls.collectives import all_gather, all_reduce, reduce_scatter
from impls.comm import Communicator

__all__ = [
    "all_gather_seq",
    "copy_to_tp",
    "gather_from_tp",
    "reduce_from_tp",
    "reduce_scatter_seq",
    "scatter_to_tp",
]


def _all_reduce_sum(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """A fresh tensor holding the sum of `x` over the group (`x` itself is left intact)."""
    if comm.world_size == 1:
        return x
    out = x.clone(memory_format=torch.contiguous_format)
    return all_reduce(out, comm, op="sum")


def _gather_along(x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`, in rank order."""
    t = comm.world_size
    if t == 1:
        return x
    dim = dim % x.dim()
    # Each rank's whole tensor is one dim-0 block of (t, *x.shape); moving the rank axis
    # next to `dim` and merging the two gives the concatenation.
    out = torch.empty((t, *x.shape), dtype=x.dtype, device=x.device)
    all_gather(out, x.contiguous(), comm)
    return out.movedim(0, dim).flatten(dim, dim + 1)


def _reduce_scatter_along(x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
    """Rank r gets block r (of t equal blocks along `dim`) of the sum of `x` over ranks."""
    t = comm.world_size
    if t == 1:
        return x
    dim = dim % x.dim()
    size = _check_divisible(x, dim, t)
    # (..., t·k, ...) -> (t, ..., k, ...): block r becomes dim-0 block r of a contiguous buffer.
    blocks = x.unflatten(dim, (t, size // t)).movedim(dim, 0).contiguous()
    out = torch.empty(blocks.shape[1:], dtype=x.dtype, device=x.device)
    return reduce_scatter(out, blocks, comm, op="sum")


def _own_slice(x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
    """Block `comm.rank` of t equal blocks of `x` along `dim`."""
    t = comm.world_size
    if t == 1:
        return x
    dim = dim % x.dim()
    k = _check_divisible(x, dim, t) // t
    return x.narrow(dim, comm.rank * k, k).contiguous()


def _check_divisible(x: torch.Tensor, dim: int, t: int) -> int:
    size = x.shape[dim]
    if size % t:
        raise ValueError(f"tensor dim {dim} has size {size}, not divisible by the group size t={t}")
    return size


# Returning an input unchanged (t = 1) is allowed: autograd makes the output a view of it.


class _CopyToTP(torch.autograd.Function):
    """Megatron's `f`: identity forward, all-reduce (sum) of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        ctx.comm = comm
        return x

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return _all_reduce_sum(grad, ctx.comm), None


class _ReduceFromTP(torch.autograd.Function):
    """Megatron's `g`: all-reduce (sum) forward, identity backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator) -> torch.Tensor:
        return _all_reduce_sum(x, comm)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None


class _GatherFromTP(torch.autograd.Function):
    """All-gather along `dim` forward; backward keeps this rank's slice of the gradient
    (every rank computed the same gradient of the replicated output)."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
        ctx.comm, ctx.dim = comm, dim
        return _gather_along(x, comm, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _own_slice(grad, ctx.comm, ctx.dim), None, None


class _ScatterToTP(torch.autograd.Function):
    """Keep this rank's slice along `dim` forward; all-gather the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
        ctx.comm, ctx.dim = comm, dim
        return _own_slice(x, comm, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather_along(grad, ctx.comm, ctx.dim), None, None


class _AllGatherSeq(torch.autograd.Function):
    """All-gather along `dim` forward; reduce-scatter backward, since every rank's copy of
    the gathered tensor feeds a different partial computation whose gradients must be summed
    before each rank keeps its own slice."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
        ctx.comm, ctx.dim = comm, dim
        return _gather_along(x, comm, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _reduce_scatter_along(grad, ctx.comm, ctx.dim), None, None


class _ReduceScatterSeq(torch.autograd.Function):
    """Reduce-scatter along `dim` forward; all-gather of the gradient backward."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, dim: int) -> torch.Tensor:
        ctx.comm, ctx.dim = comm, dim
        return _reduce_scatter_along(x, comm, dim)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:
        return _gather_along(grad, ctx.comm, ctx.dim), None, None


def copy_to_tp(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Megatron's `f`: `x` unchanged; in backward, the gradient summed over the TP group.

    Place it where a replicated activation enters column-parallel layers: each rank's
    shard contributes a partial gradient of the input.
    """
    return _CopyToTP.apply(x, comm)


def reduce_from_tp(x: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Megatron's `g`: `x` summed over the TP group; the gradient passes unchanged."""
    return _ReduceFromTP.apply(x, comm)


def gather_from_tp(x: torch.Tensor, comm: Communicator, dim: int = -1) -> torch.Tensor:
    """Concatenate every rank's `x` along `dim`; backward keeps this rank's gradient slice."""
    return _GatherFromTP.apply(x, comm, dim)


def scatter_to_tp(x: torch.Tensor, comm: Communicator, dim: int = -1) -> torch.Tensor:
    """This rank's block of t equal blocks of `x` along `dim`; backward all-gathers."""
    return _ScatterToTP.apply(x, comm, dim)


def all_gather_seq(x: torch.Tensor, comm: Communicator, dim: int = 1) -> torch.Tensor:
    """Sequence shards -> the whole sequence (along `dim`); backward reduce-scatters."""
    return _AllGatherSeq.apply(x, comm, dim)


def reduce_scatter_seq(x: torch.Tensor, comm: Communicator, dim: int = 1) -> torch.Tensor:
    """Partial sums of the whole sequence -> this rank's summed sequence shard along `dim`;
    backward all-gathers."""
    return _ReduceScatterSeq.apply(x, comm, dim)
