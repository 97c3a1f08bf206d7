"""Ring algorithms: reduce-scatter, all-gather, and all-reduce as their composition.

The lecture's bandwidth-optimal all-reduce (Patarasuk & Yuan 2009; Baidu's ring
all-reduce): ranks form a ring and, in each of N−1 steps, pass one 1/N-sized chunk to
the right while receiving one from the left. Reduce-scatter leaves rank r holding the
fully reduced chunk r; all-gather then circulates the finished chunks. Each rank sends
2(N−1)/N·M bytes in 2(N−1) rounds, whatever N is: O(1) bandwidth per node, O(N) time.
"""

from __future__ import annotations

import torch

from impls.collectives.partition import even_splits
from impls.collectives.reduce_ops import combine_into
from impls.collectives.spec import AllReduceAlgorithm
from impls.comm import Communicator
from impls.costmodel.comm import ring_path

__all__ = ["RING", "ring_all_gather", "ring_all_reduce", "ring_reduce_scatter"]


def ring_reduce_scatter(
    src: torch.Tensor,
    spans: list[tuple[int, int]],
    comm: Communicator,
    op: str,
    out: torch.Tensor,
) -> None:
    """Write into `out` on rank r the reduction over all ranks of chunk `spans[r]` of `src`.

    `src` is only read (`out` may alias src's chunk r). Step s forwards the partial
    reduction of chunk r−s−1 and receives the left neighbour's partial chunk r−s−2,
    adding our own contribution to it; two staging buffers alternate so that the one
    being sent is never the one being received into. After N−1 steps chunk r is complete.
    """
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    width = max(length for _, length in spans)
    staging = comm.scratch(2 * width, src.dtype)
    buffers = (staging[:width], staging[width:])
    outgoing = _chunk(src, spans[(r - 1) % n])
    for step in range(n - 1):
        offset, length = spans[(r - step - 2) % n]
        incoming = buffers[step % 2][:length]
        with comm.round() as rnd:
            if length:
                rnd.recv(incoming, left)
            if outgoing.numel():
                rnd.send(outgoing, right)
        last = step == n - 2
        combine_into(out if last else incoming, incoming, src[offset : offset + length], op)
        outgoing = incoming


def ring_all_gather(flat: torch.Tensor, spans: list[tuple[int, int]], comm: Communicator) -> None:
    """Given chunk `spans[r]` valid on rank r, make every chunk valid on every rank."""
    n, r = comm.world_size, comm.rank
    right, left = (r + 1) % n, (r - 1) % n
    for step in range(n - 1):
        send_off, send_len = spans[(r - step) % n]
        recv_off, recv_len = spans[(r - step - 1) % n]
        with comm.round() as rnd:
            if recv_len:
                rnd.recv(flat[recv_off : recv_off + recv_len], left)
            if send_len:
                rnd.send(flat[send_off : send_off + send_len], right)


def ring_all_reduce(flat: torch.Tensor, comm: Communicator, op: str) -> None:
    """All-reduce a 1-D buffer in place: ring reduce-scatter, then ring all-gather."""
    if comm.world_size == 1 or flat.numel() == 0:
        return
    spans = even_splits(flat.numel(), comm.world_size)
    ring_reduce_scatter(flat, spans, comm, op, out=_chunk(flat, spans[comm.rank]))
    ring_all_gather(flat, spans, comm)


def _chunk(flat: torch.Tensor, span: tuple[int, int]) -> torch.Tensor:
    offset, length = span
    return flat[offset : offset + length]


RING = AllReduceAlgorithm(
    name="ring",
    run=ring_all_reduce,
    critical_path=ring_path,
    orders={"rounds": "O(N)", "peak": "O(1)", "total": "O(N)"},
)
