"""Binomial trees: reduce to a root, broadcast from a root, and all-reduce as both.

In step k every rank whose relative rank has bit k set sends to the rank 2^k below it
and drops out (reduce), or the reverse (broadcast): ⌈log2 N⌉ rounds each, and the root
moves ⌈log2 N⌉·M bytes. Latency-optimal for small messages; for large ones the ring's
2(N−1)/N·M per rank wins.
"""

from __future__ import annotations

import torch

from impls.collectives.reduce_ops import combine
from impls.collectives.spec import AllReduceAlgorithm
from impls.comm import Communicator
from impls.costmodel.comm import tree_path

__all__ = ["TREE", "binomial_broadcast", "binomial_reduce", "tree_all_reduce"]


def binomial_reduce(flat: torch.Tensor, comm: Communicator, op: str, root: int = 0) -> None:
    """Reduce into `flat` on `root`; other ranks' buffers are left partially reduced."""
    n = comm.world_size
    if n == 1 or flat.numel() == 0:
        return
    rel = (comm.rank - root) % n
    incoming = comm.scratch(flat.numel(), flat.dtype)
    distance = 1
    while distance < n:
        if rel & distance:
            comm.send(flat, (rel - distance + root) % n)
            return
        if rel + distance < n:
            comm.recv(incoming, (rel + distance + root) % n)
            combine(flat, incoming, op)
        distance *= 2


def binomial_broadcast(flat: torch.Tensor, comm: Communicator, root: int = 0) -> None:
    """Copy `flat` from `root` to every rank."""
    n = comm.world_size
    if n == 1 or flat.numel() == 0:
        return
    rel = (comm.rank - root) % n
    top = 1 << (n - 1).bit_length()  # first power of two ≥ n
    # A non-root rank receives once, from the rank that clears its lowest set bit...
    lowest = rel & -rel if rel else top
    if rel:
        comm.recv(flat, (rel - lowest + root) % n)
    # ...then forwards to the ranks below that bit, largest subtree first.
    distance = lowest // 2
    while distance >= 1:
        if rel + distance < n:
            comm.send(flat, (rel + distance + root) % n)
        distance //= 2


def tree_all_reduce(flat: torch.Tensor, comm: Communicator, op: str) -> None:
    """In-place all-reduce: binomial reduce to rank 0, then binomial broadcast."""
    binomial_reduce(flat, comm, op, root=0)
    binomial_broadcast(flat, comm, root=0)


TREE = AllReduceAlgorithm(
    name="tree",
    run=tree_all_reduce,
    critical_path=tree_path,
    orders=None,  # not in the lecture's table
)
