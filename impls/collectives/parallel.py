"""The lecture's "parallel reduce" all-reduce: every rank sends its whole buffer to
every other rank in a single round and reduces locally.

One round (O(1) time) at the price of (N−1)·M bytes per rank and N(N−1)·M in total:
the O(N²) total bandwidth of the lecture's comparison table.
"""

from __future__ import annotations

import torch

from impls.collectives.reduce_ops import combine
from impls.collectives.spec import AllReduceAlgorithm
from impls.comm import Communicator
from impls.costmodel.comm import parallel_path

__all__ = ["PARALLEL", "parallel_all_reduce"]


def parallel_all_reduce(flat: torch.Tensor, comm: Communicator, op: str) -> None:
    """In-place all-reduce of a 1-D buffer by all-to-all exchange of whole buffers."""
    n, r = comm.world_size, comm.rank
    if n == 1 or flat.numel() == 0:
        return
    peers = [(r + k) % n for k in range(1, n)]
    staging = comm.scratch(flat.numel() * (n - 1), flat.dtype).view(n - 1, -1)
    with comm.round() as rnd:
        for slot, peer in enumerate(peers):
            rnd.recv(staging[slot], peer)
        for peer in peers:
            rnd.send(flat, peer)
    # Reduce in rank order on every rank, so floating-point results are bitwise equal
    # everywhere (each rank would otherwise add the same terms in a different order).
    slot_of = {peer: slot for slot, peer in enumerate(peers)}
    terms = [flat if q == r else staging[slot_of[q]] for q in range(n)]
    acc = terms[0]
    for term in terms[1:]:
        combine(acc, term, op)
    if acc is not flat:
        flat.copy_(acc)


PARALLEL = AllReduceAlgorithm(
    name="parallel",
    run=parallel_all_reduce,
    critical_path=parallel_path,
    orders={"rounds": "O(1)", "peak": "O(N)", "total": "O(N^2)"},
)
