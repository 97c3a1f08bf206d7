"""Rabenseifner's all-reduce: recursive-halving reduce-scatter, then recursive-doubling
all-gather (Thakur, Rabenseifner & Gropp 2005, "Optimization of collective
communication operations in MPICH"; the lecture's "Recursive Halving All Reduce").

In step k a rank exchanges half of its current span with the partner at distance 2^k
(offsets 1, 2, 4, … as in the lecture's figure) and keeps reducing the half it owns;
the all-gather retraces the steps backwards. For power-of-two N: 2·log2 N rounds and
2(N−1)/N·M bytes per rank — ring's bandwidth with logarithmic latency.

Non-power-of-two N (MPICH's fold): with p the largest power of two ≤ N and e = N − p,
the first 2e ranks pair up; each even rank hands its buffer to its odd neighbour and
waits. The p remaining ranks run the power-of-two algorithm, then each odd rank returns
the result to its neighbour: two extra rounds.
"""

from __future__ import annotations

import torch

from impls.collectives.partition import halve
from impls.collectives.reduce_ops import combine
from impls.collectives.spec import AllReduceAlgorithm
from impls.comm import Communicator
from impls.costmodel.comm import recursive_halving_path

__all__ = ["RECURSIVE_HALVING", "recursive_halving_all_reduce"]


def recursive_halving_all_reduce(flat: torch.Tensor, comm: Communicator, op: str) -> None:
    """In-place all-reduce of a 1-D buffer, any world size."""
    n, r = comm.world_size, comm.rank
    if n == 1 or flat.numel() == 0:
        return
    p = 1 << (n.bit_length() - 1)
    extra = n - p
    scratch = comm.scratch(flat.numel(), flat.dtype)
    if r < 2 * extra:
        if r % 2 == 0:  # folded out: contribute, then wait for the answer
            comm.send(flat, r + 1)
            comm.recv(flat, r + 1)
            return
        comm.recv(scratch, r - 1)
        combine(flat, scratch, op)
    virtual = r // 2 if r < 2 * extra else r - extra

    def real(v: int) -> int:
        return 2 * v + 1 if v < extra else v + extra

    steps = _halving_reduce_scatter(flat, scratch, comm, op, virtual, p, real)
    _doubling_all_gather(flat, comm, steps)
    if r < 2 * extra:
        comm.send(flat, r - 1)


def _halving_reduce_scatter(flat, scratch, comm, op, virtual, p, real):
    span, steps, distance = (0, flat.numel()), [], 1
    while distance < p:
        partner = real(virtual ^ distance)
        low, high = halve(*span)
        keep, give = (low, high) if virtual & distance == 0 else (high, low)
        incoming = scratch[: keep[1]]
        with comm.round() as rnd:
            if keep[1]:
                rnd.recv(incoming, partner)
            if give[1]:
                rnd.send(_view(flat, give), partner)
        if keep[1]:
            combine(_view(flat, keep), incoming, op)
        steps.append((keep, give, partner))
        span, distance = keep, distance * 2
    return steps


def _doubling_all_gather(flat, comm, steps) -> None:
    for keep, give, partner in reversed(steps):
        with comm.round() as rnd:
            if give[1]:
                rnd.recv(_view(flat, give), partner)
            if keep[1]:
                rnd.send(_view(flat, keep), partner)


def _view(flat: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    offset, length = span
    return flat[offset : offset + length]


RECURSIVE_HALVING = AllReduceAlgorithm(
    name="recursive_halving",
    run=recursive_halving_all_reduce,
    critical_path=recursive_halving_path,
    orders={"rounds": "O(log N)"},  # the lecture gives only its time
)
