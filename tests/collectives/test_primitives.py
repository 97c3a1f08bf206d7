"""broadcast, reduce, scatter, gather, all_gather, reduce_scatter and all_to_all equal
torch.distributed's own on every rank, for world sizes 1..8 and every root.

A failure means a primitive that later issues (ZeRO's reduce-scatter/all-gather, Ulysses'
all-to-all, pipeline broadcasts) build on gives wrong data."""

from __future__ import annotations

import torch
import torch.distributed as dist

from impls import collectives as C
from tests.rank_support import mismatch, pattern, prefix_communicator

TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX}
EXACT = {"rtol": 0, "atol": 0}


def check_rooted(k_values=range(1, 9)) -> list[str]:
    errors = []
    for k in k_values:
        comm = prefix_communicator(k)
        if comm is None:
            continue
        g = comm.group
        for root in range(k):
            x = pattern(comm.rank, 13, torch.float32, seed=root)
            want = x.clone()
            dist.broadcast(want, dist.get_global_rank(g, root), group=g)
            errors.append(
                mismatch(
                    f"broadcast N={k} src={root}",
                    C.broadcast(x.clone(), comm, src=root),
                    want,
                    **EXACT,
                )
            )
            for op, top in TORCH_OPS.items():
                want = x.clone()
                dist.reduce(want, dist.get_global_rank(g, root), op=top, group=g)
                got, kept = x.clone(), x.clone()
                C.reduce(got, comm, dst=root, op=op)
                if comm.rank == root:
                    errors.append(mismatch(f"reduce N={k} dst={root} {op}", got, want, **EXACT))
                else:
                    errors.append(
                        mismatch(f"reduce N={k} keeps non-root input", got, kept, **EXACT)
                    )
            errors += _scatter_gather(comm, k, root)
    return [e for e in errors if e]


def _scatter_gather(comm, k, root) -> list[str]:
    g, errors = comm.group, []
    groot = dist.get_global_rank(g, root)
    chunks = [pattern(100 + i, 5, torch.int64, seed=root) for i in range(k)]
    want, got = torch.empty(5, dtype=torch.int64), torch.empty(5, dtype=torch.int64)
    dist.scatter(want, chunks if comm.rank == root else None, src=groot, group=g)
    C.scatter(got, comm, scatter_list=chunks if comm.rank == root else None, src=root)
    errors.append(mismatch(f"scatter N={k} src={root}", got, want, **EXACT))
    mine = pattern(comm.rank, 6, torch.bfloat16)
    want_list = [torch.empty(6, dtype=torch.bfloat16) for _ in range(k)]
    got_list = [torch.empty(6, dtype=torch.bfloat16) for _ in range(k)]
    dist.gather(mine, want_list if comm.rank == root else None, dst=groot, group=g)
    C.gather(mine, comm, gather_list=got_list if comm.rank == root else None, dst=root)
    if comm.rank == root:
        errors.append(
            mismatch(
                f"gather N={k} dst={root}", torch.stack(got_list), torch.stack(want_list), **EXACT
            )
        )
    return errors


def check_many_to_many() -> list[str]:
    errors = []
    for k in range(1, 9):
        comm = prefix_communicator(k)
        if comm is None:
            continue
        g = comm.group
        for per_rank in (0, 1, 5, 1001):
            for dtype in (torch.float32, torch.float16, torch.int64):
                x = pattern(comm.rank, per_rank, dtype)
                want = torch.empty(k * per_rank, dtype=dtype)
                dist.all_gather_into_tensor(want, x, group=g)
                got = C.all_gather(torch.empty(k * per_rank, dtype=dtype), x, comm)
                errors.append(
                    mismatch(f"all_gather N={k} n={per_rank} {dtype}", got, want, **EXACT)
                )
                full = pattern(comm.rank, k * per_rank, dtype, seed=7)
                for op, top in TORCH_OPS.items():
                    want = torch.empty(per_rank, dtype=dtype)
                    dist.reduce_scatter_tensor(want, full.clone(), op=top, group=g)
                    got = C.reduce_scatter(torch.empty(per_rank, dtype=dtype), full, comm, op=op)
                    errors.append(
                        mismatch(f"reduce_scatter N={k} n={per_rank} {op}", got, want, **EXACT)
                    )
                errors.append(
                    mismatch(
                        "reduce_scatter keeps input",
                        full,
                        pattern(comm.rank, k * per_rank, dtype, seed=7),
                        **EXACT,
                    )
                )
                want = torch.empty(k * per_rank, dtype=dtype)
                dist.all_to_all_single(want, full, group=g)
                got = C.all_to_all(torch.empty(k * per_rank, dtype=dtype), full, comm)
                errors.append(
                    mismatch(f"all_to_all N={k} n={per_rank} {dtype}", got, want, **EXACT)
                )
    return [e for e in errors if e]


def test_rooted_primitives_equal_torch(ranks8):
    errors = [e for rank_errors in ranks8.run(check_rooted) for e in rank_errors]
    assert not errors, "\n".join(errors[:20])


def test_many_to_many_primitives_equal_torch(ranks8):
    errors = [e for rank_errors in ranks8.run(check_many_to_many) for e in rank_errors]
    assert not errors, "\n".join(errors[:20])


def bad_root() -> str:
    comm = prefix_communicator(2)
    if comm is None:
        return ""
    try:
        C.broadcast(torch.zeros(1), comm, src=5)
    except ValueError as err:
        return str(err)
    return "no error"


def test_bad_root_is_refused(ranks8):
    assert "src=5 is not a rank of a group of 2" in ranks8.run(bad_root)[0]
