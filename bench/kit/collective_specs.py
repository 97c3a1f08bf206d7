"""nccl-tests-style hooks for each collective: sizes, inputs with a known answer, the
bus-bandwidth factor, and how to run it with distbench's implementation or torch's.

Inputs are small integers, so every sum over ≤ 8 ranks is exact in float32 and the
`wrong` count (elements that differ from the known answer) must be zero.

Sizes and the bus-bandwidth factor of each collective follow nccl-tests (`CollectiveSpec`).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.distributed as dist

from impls import collectives as C
from impls.comm import Communicator

__all__ = ["COLLECTIVES", "CollectiveSpec", "Buffers"]


def _pattern(rank: int, numel: int, dtype: torch.dtype, device="cpu") -> torch.Tensor:
    return ((torch.arange(numel, device=device) % 5 + 1) * (rank + 1)).to(dtype)


@dataclass
class Buffers:
    """One rank's buffers for one collective call, plus what they must hold afterwards."""

    run_distbench: Callable[[], object]
    run_torch: Callable[[], object]
    fill: Callable[[bool], None]  # True: the test pattern; False: zeros (timing)
    result: Callable[[], torch.Tensor | None]
    expected: torch.Tensor | None  # None on ranks without a defined result
    # all-reduce: the same buffer reduced by a named from-scratch algorithm (auto's cell
    # times each beside its own choice); None for the other collectives
    run_algorithm: Callable[[str], object] | None = None


@dataclass(frozen=True)
class CollectiveSpec:
    """One collective as nccl-tests runs it: its bus-bandwidth factor and how to build its
    buffers with a known answer.

    Sizes follow nccl-tests (doc/PERFORMANCE.md): S is the buffer of an all-reduce,
    broadcast or reduce; the *total* gathered/scattered buffer (N × per-rank block) of an
    all-gather, reduce-scatter, gather or scatter; and each rank's whole send buffer of an
    all-to-all. busbw = algbw × factor, the factor making busbw comparable to the hardware's
    link bandwidth whatever the collective and N:
    - all_reduce 2(N−1)/N: a bandwidth-optimal all-reduce moves every byte out and back
      in through each rank's link, less the 1/N it keeps;
    - all_gather, reduce_scatter, all_to_all, scatter, gather (N−1)/N: each rank's link
      carries all of S except its own block;
    - broadcast, reduce 1: a pipelined tree or chain can approach S per link.
    """

    name: str
    bus_factor: Callable[[int], float]
    build: Callable[[Communicator, int, torch.dtype, str], Buffers]
    block_divides: bool  # S splits into N per-rank blocks


def _all_reduce(comm, numel, dtype, algorithm) -> Buffers:
    n, r, g = comm.world_size, comm.rank, comm.group
    buf = torch.empty(numel, dtype=dtype, device=comm.device)
    expected = _pattern(0, numel, dtype) * (n * (n + 1) // 2)
    return Buffers(
        run_distbench=lambda: C.all_reduce(buf, comm, algorithm=algorithm),
        run_torch=lambda: dist.all_reduce(buf, group=g),
        fill=lambda real: buf.copy_(_pattern(r, numel, dtype)) if real else buf.zero_(),
        result=lambda: buf,
        expected=expected,
        run_algorithm=lambda name: C.all_reduce(buf, comm, algorithm=name),
    )


def _broadcast(comm, numel, dtype, _alg) -> Buffers:
    r, g = comm.rank, comm.group
    buf = torch.empty(numel, dtype=dtype, device=comm.device)
    root = dist.get_global_rank(g, 0)
    return Buffers(
        run_distbench=lambda: C.broadcast(buf, comm, src=0),
        run_torch=lambda: dist.broadcast(buf, root, group=g),
        fill=lambda real: buf.copy_(_pattern(r, numel, dtype)) if real else buf.zero_(),
        result=lambda: buf,
        expected=_pattern(0, numel, dtype),
    )


def _reduce(comm, numel, dtype, _alg) -> Buffers:
    n, r, g = comm.world_size, comm.rank, comm.group
    buf = torch.empty(numel, dtype=dtype, device=comm.device)
    root = dist.get_global_rank(g, 0)
    return Buffers(
        run_distbench=lambda: C.reduce(buf, comm, dst=0),
        run_torch=lambda: dist.reduce(buf, root, group=g),
        fill=lambda real: buf.copy_(_pattern(r, numel, dtype)) if real else buf.zero_(),
        result=lambda: buf,
        expected=_pattern(0, numel, dtype) * (n * (n + 1) // 2) if r == 0 else None,
    )


def _scatter(comm, numel, dtype, _alg) -> Buffers:
    n, r, g = comm.world_size, comm.rank, comm.group
    block = numel // n
    out = torch.empty(block, dtype=dtype, device=comm.device)
    chunks = (
        [torch.empty(block, dtype=dtype, device=comm.device) for _ in range(n)] if r == 0 else None
    )
    root = dist.get_global_rank(g, 0)

    def fill(real: bool) -> None:
        out.zero_()
        for q, chunk in enumerate(chunks or []):
            chunk.copy_(_pattern(q, block, dtype)) if real else chunk.zero_()

    return Buffers(
        run_distbench=lambda: C.scatter(out, comm, scatter_list=chunks, src=0),
        run_torch=lambda: dist.scatter(out, chunks, src=root, group=g),
        fill=fill,
        result=lambda: out,
        expected=_pattern(r, block, dtype),
    )


def _gather(comm, numel, dtype, _alg) -> Buffers:
    n, r, g = comm.world_size, comm.rank, comm.group
    block = numel // n
    mine = torch.empty(block, dtype=dtype, device=comm.device)
    slots = (
        [torch.empty(block, dtype=dtype, device=comm.device) for _ in range(n)] if r == 0 else None
    )
    root = dist.get_global_rank(g, 0)
    expected = torch.cat([_pattern(q, block, dtype) for q in range(n)]) if r == 0 else None
    return Buffers(
        run_distbench=lambda: C.gather(mine, comm, gather_list=slots, dst=0),
        run_torch=lambda: dist.gather(mine, slots, dst=root, group=g),
        fill=lambda real: mine.copy_(_pattern(r, block, dtype)) if real else mine.zero_(),
        result=lambda: torch.cat(slots) if slots else None,
        expected=expected,
    )


def _all_gather(comm, numel, dtype, _alg) -> Buffers:
    n, r, g = comm.world_size, comm.rank, comm.group
    block = numel // n
    mine, out = (
        torch.empty(block, dtype=dtype, device=comm.device),
        torch.empty(block * n, dtype=dtype, device=comm.device),
    )
    return Buffers(
        run_distbench=lambda: C.all_gather(out, mine, comm),
        run_torch=lambda: dist.all_gather_into_tensor(out, mine, group=g),
        fill=lambda real: mine.copy_(_pattern(r, block, dtype)) if real else mine.zero_(),
        result=lambda: out,
        expected=torch.cat([_pattern(q, block, dtype) for q in range(n)]),
    )


def _reduce_scatter(comm, numel, dtype, _alg) -> Buffers:
    n, r, g = comm.world_size, comm.rank, comm.group
    block = numel // n
    full, out = (
        torch.empty(block * n, dtype=dtype, device=comm.device),
        torch.empty(block, dtype=dtype, device=comm.device),
    )
    total = _pattern(0, block * n, dtype) * (n * (n + 1) // 2)
    return Buffers(
        run_distbench=lambda: C.reduce_scatter(out, full, comm),
        run_torch=lambda: dist.reduce_scatter_tensor(out, full, group=g),
        fill=lambda real: full.copy_(_pattern(r, block * n, dtype)) if real else full.zero_(),
        result=lambda: out,
        expected=total[r * block : (r + 1) * block],
    )


def _all_to_all(comm, numel, dtype, _alg) -> Buffers:
    n, r, g = comm.world_size, comm.rank, comm.group
    block = numel // n
    src, out = (
        torch.empty(block * n, dtype=dtype, device=comm.device),
        torch.empty(block * n, dtype=dtype, device=comm.device),
    )
    # Block j of rank q's input is q's pattern offset by j·block; rank r receives block r of each.
    expected = torch.cat(
        [_pattern(q, block * n, dtype)[r * block : (r + 1) * block] for q in range(n)]
    )
    return Buffers(
        run_distbench=lambda: C.all_to_all(out, src, comm),
        run_torch=lambda: dist.all_to_all_single(out, src, group=g),
        fill=lambda real: src.copy_(_pattern(r, block * n, dtype)) if real else src.zero_(),
        result=lambda: out,
        expected=expected,
    )


def _ratio(n: int) -> float:
    return (n - 1) / n


COLLECTIVES: dict[str, CollectiveSpec] = {
    "all_reduce": CollectiveSpec("all_reduce", lambda n: 2 * (n - 1) / n, _all_reduce, False),
    "broadcast": CollectiveSpec("broadcast", lambda n: 1.0, _broadcast, False),
    "reduce": CollectiveSpec("reduce", lambda n: 1.0, _reduce, False),
    "scatter": CollectiveSpec("scatter", _ratio, _scatter, True),
    "gather": CollectiveSpec("gather", _ratio, _gather, True),
    "all_gather": CollectiveSpec("all_gather", _ratio, _all_gather, True),
    "reduce_scatter": CollectiveSpec("reduce_scatter", _ratio, _reduce_scatter, True),
    "all_to_all": CollectiveSpec("all_to_all", _ratio, _all_to_all, True),
}
