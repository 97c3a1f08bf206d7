"""The lecture's communication primitives, built on counted point-to-point messages.

Signatures follow torch.distributed (`broadcast`, `reduce`, `scatter`, `gather`,
`all_gather_into_tensor`, `reduce_scatter_tensor`, `all_to_all_single`, `barrier`) with
the communicator passed explicitly, so each can be checked against torch's own:
- broadcast / reduce: binomial tree, ⌈log2 N⌉ rounds;
- scatter / gather: the root exchanges with every rank in one round;
- all_gather / reduce_scatter: ring, N−1 rounds, (N−1)/N of the total per rank;
- all_to_all: every pair exchanges its block in one round;
- barrier: dissemination barrier, ⌈log2 N⌉ rounds of one-byte messages.
"""

from __future__ import annotations

import torch

from impls.collectives.partition import even_splits, flat_view
from impls.collectives.reduce_ops import check_op, finish
from impls.collectives.ring import ring_all_gather, ring_reduce_scatter
from impls.collectives.tree import binomial_broadcast, binomial_reduce
from impls.comm import Communicator

__all__ = [
    "all_gather",
    "all_to_all",
    "barrier",
    "broadcast",
    "gather",
    "reduce",
    "reduce_scatter",
    "scatter",
]


def broadcast(tensor: torch.Tensor, comm: Communicator, *, src: int = 0) -> torch.Tensor:
    """Copy `tensor` from rank `src` into `tensor` on every rank."""
    comm.count_call("broadcast")
    _check_rank(src, comm, "src")
    binomial_broadcast(flat_view(tensor), comm, root=src)
    return tensor


def reduce(
    tensor: torch.Tensor, comm: Communicator, *, dst: int = 0, op: str = "sum"
) -> torch.Tensor:
    """Reduce every rank's `tensor` into `tensor` on rank `dst`; others are left unchanged."""
    comm.count_call("reduce")
    check_op(op)
    _check_rank(dst, comm, "dst")
    flat = flat_view(tensor)
    rel = (comm.rank - dst) % comm.world_size
    has_children = rel % 2 == 0 and rel + 1 < comm.world_size
    # Interior tree ranks accumulate partial sums: give them a copy, not the caller's data.
    work = flat
    if comm.rank != dst and has_children:
        work = comm.scratch(flat.numel(), flat.dtype, slot=1)
        work.copy_(flat)
    binomial_reduce(work, comm, op, root=dst)
    if comm.rank == dst:
        finish(flat, op, comm.world_size)
    return tensor


def scatter(
    output: torch.Tensor,
    comm: Communicator,
    *,
    scatter_list: list[torch.Tensor] | None = None,
    src: int = 0,
) -> torch.Tensor:
    """Rank i receives `scatter_list[i]` from `src` into `output`."""
    comm.count_call("scatter")
    _check_rank(src, comm, "src")
    if comm.rank != src:
        comm.recv(output, src)
        return output
    _check_list(scatter_list, output, comm, "scatter_list")
    with comm.round() as rnd:
        for peer, chunk in enumerate(scatter_list):
            if peer != src:
                rnd.send(chunk.contiguous(), peer)
    output.copy_(scatter_list[src])
    return output


def gather(
    tensor: torch.Tensor,
    comm: Communicator,
    *,
    gather_list: list[torch.Tensor] | None = None,
    dst: int = 0,
) -> list[torch.Tensor] | None:
    """`gather_list[i]` on `dst` receives rank i's `tensor`."""
    comm.count_call("gather")
    _check_rank(dst, comm, "dst")
    if comm.rank != dst:
        comm.send(tensor.contiguous(), dst)
        return None
    _check_list(gather_list, tensor, comm, "gather_list")
    with comm.round() as rnd:
        for peer, slot in enumerate(gather_list):
            if peer != dst:
                rnd.recv(slot, peer)
    gather_list[dst].copy_(tensor)
    return gather_list


def all_gather(output: torch.Tensor, input: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Concatenate every rank's `input` (along dim 0) into `output` on every rank."""
    comm.count_call("all_gather")
    n, k = comm.world_size, input.numel()
    _check_sizes(output, n * k, "output", "world_size × input.numel()")
    flat = flat_view(output)
    spans = [(i * k, k) for i in range(n)]
    flat[comm.rank * k : (comm.rank + 1) * k].copy_(input.reshape(-1))
    if k:
        ring_all_gather(flat, spans, comm)
    return output


def reduce_scatter(
    output: torch.Tensor, input: torch.Tensor, comm: Communicator, *, op: str = "sum"
) -> torch.Tensor:
    """Rank r receives the reduction over ranks of block r of `input` (N equal blocks)."""
    comm.count_call("reduce_scatter")
    check_op(op)
    n, k = comm.world_size, output.numel()
    _check_sizes(input, n * k, "input", "world_size × output.numel()")
    src, out = flat_view(input.contiguous()), flat_view(output)
    if n == 1:
        out.copy_(src)
    elif k:
        ring_reduce_scatter(src, [(i * k, k) for i in range(n)], comm, op, out=out)
    finish(out, op, n)
    return output


def all_to_all(output: torch.Tensor, input: torch.Tensor, comm: Communicator) -> torch.Tensor:
    """Block j of rank i's `input` lands in block i of rank j's `output` (N equal blocks)."""
    comm.count_call("all_to_all")
    n, r = comm.world_size, comm.rank
    _check_sizes(output, input.numel(), "output", "input.numel()")
    if input.numel() % n:
        raise ValueError(f"input.numel()={input.numel()} is not divisible by world_size={n}")
    src, dst = flat_view(input.contiguous()), flat_view(output)
    blocks = even_splits(src.numel(), n)
    with comm.round() as rnd:
        for peer in range(n):
            offset, length = blocks[peer]
            if peer != r and length:
                rnd.recv(dst[offset : offset + length], peer)
                rnd.send(src[offset : offset + length], peer)
    offset, length = blocks[r]
    dst[offset : offset + length].copy_(src[offset : offset + length])
    return output


def barrier(comm: Communicator) -> None:
    """Return once every rank has entered (dissemination barrier, Hensgen et al. 1988)."""
    comm.count_call("barrier")
    n, r = comm.world_size, comm.rank
    token = torch.zeros(1, dtype=torch.uint8, device=comm.device)
    sink = torch.empty(1, dtype=torch.uint8, device=comm.device)
    distance = 1
    while distance < n:
        with comm.round() as rnd:
            rnd.recv(sink, (r - distance) % n)
            rnd.send(token, (r + distance) % n)
        distance *= 2


def _check_rank(rank: int, comm: Communicator, key: str) -> None:
    if not 0 <= rank < comm.world_size:
        raise ValueError(f"{key}={rank} is not a rank of a group of {comm.world_size}")


def _check_sizes(tensor: torch.Tensor, expected: int, key: str, rule: str) -> None:
    if tensor.numel() != expected:
        raise ValueError(f"{key} has {tensor.numel()} elements; it needs {rule} = {expected}")


def _check_list(tensors, like: torch.Tensor, comm: Communicator, key: str) -> None:
    if tensors is None or len(tensors) != comm.world_size:
        raise ValueError(f"{key} must hold world_size={comm.world_size} tensors on the root")
    for t in tensors:
        if t.shape != like.shape or t.dtype != like.dtype:
            raise ValueError(f"every tensor of {key} must match shape and dtype of the local one")
