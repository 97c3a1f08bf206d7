"""All-reduce through one central rank: the parameter server and the sequential variant.

`parameter_server_all_reduce` is the lecture's DP 1.0 traffic pattern (Li et al. 2014):
every worker pushes its whole buffer to the server in one round (Push & Sum = reduce),
the server sums and pushes the result back in a second round (Replicate & Pull =
broadcast). Two rounds, O(1) time; the server moves (N−1)·M each way, O(N).

`sequential_all_reduce` is the lecture's naive all-reduce: the same traffic, but the
server merges one worker per round and then returns the result one worker per round,
so 2(N−1) rounds: O(N) time, O(N) peak and O(N) total bandwidth.
"""

from __future__ import annotations

import torch

from impls.collectives.reduce_ops import combine
from impls.collectives.spec import AllReduceAlgorithm
from impls.comm import Communicator
from impls.costmodel.comm import server_path

__all__ = ["PARAMETER_SERVER", "SEQUENTIAL", "parameter_server_all_reduce", "sequential_all_reduce"]


def parameter_server_all_reduce(
    flat: torch.Tensor, comm: Communicator, op: str, server: int = 0
) -> None:
    """In-place all-reduce of a 1-D buffer via a server rank (default 0)."""
    if _worker_side(flat, comm, server):
        return
    workers = [w for w in range(comm.world_size) if w != server]
    # The server receives every push at once, so it needs one staging slot per worker.
    staging = comm.scratch(flat.numel() * len(workers), flat.dtype).view(len(workers), -1)
    with comm.round() as push:
        for slot, worker in enumerate(workers):
            push.recv(staging[slot], worker)
    for slot in range(len(workers)):
        combine(flat, staging[slot], op)
    with comm.round() as pull:
        for worker in workers:
            pull.send(flat, worker)


def sequential_all_reduce(flat: torch.Tensor, comm: Communicator, op: str, server: int = 0) -> None:
    """In-place all-reduce where the server handles one worker per round, both ways."""
    if _worker_side(flat, comm, server):
        return
    incoming = comm.scratch(flat.numel(), flat.dtype)
    workers = [w for w in range(comm.world_size) if w != server]
    for worker in workers:
        comm.recv(incoming, worker)
        combine(flat, incoming, op)
    for worker in workers:
        comm.send(flat, worker)


def _worker_side(flat: torch.Tensor, comm: Communicator, server: int) -> bool:
    """Everything a non-server rank does (push, then pull); True when nothing is left."""
    if comm.world_size == 1 or flat.numel() == 0:
        return True
    if comm.rank == server:
        return False
    comm.send(flat, server)
    comm.recv(flat, server)
    return True


PARAMETER_SERVER = AllReduceAlgorithm(
    name="parameter_server",
    run=parameter_server_all_reduce,
    critical_path=server_path,
    orders={"rounds": "O(1)", "peak": "O(N)", "total": "O(N)"},
)
SEQUENTIAL = AllReduceAlgorithm(
    name="sequential",
    run=sequential_all_reduce,
    critical_path=server_path,
    orders={"rounds": "O(N)", "peak": "O(N)", "total": "O(N)"},
)
