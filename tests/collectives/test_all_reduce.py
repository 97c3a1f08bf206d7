"""Every all-reduce algorithm equals torch.distributed.all_reduce on every rank.

A failure here means an algorithm computes a wrong result for some world size, length,
dtype, op or in/out-of-place mode — the foundation every later experiment trusts."""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from impls.collectives import ALGORITHMS, all_reduce
from tests.rank_support import mismatch, pattern, prefix_communicator

DTYPES = (torch.float32, torch.float16, torch.bfloat16, torch.int64)
LENGTHS = (0, 1, 7, 1003)  # empty, one element, fewer than N, not divisible by N
TORCH_OPS = {"sum": dist.ReduceOp.SUM, "max": dist.ReduceOp.MAX, "avg": dist.ReduceOp.AVG}


def check_algorithm_against_torch(algorithm: str) -> list[str]:
    errors = []
    for k in range(1, 9):
        comm = prefix_communicator(k)
        if comm is None:
            continue
        for dtype in DTYPES:
            for numel in LENGTHS:
                for op in ("sum", "avg", "max"):
                    errors += _one_case(comm, algorithm, k, dtype, numel, op)
    return errors


def _one_case(comm, algorithm, k, dtype, numel, op) -> list[str]:
    name = f"{algorithm} N={k} {dtype} numel={numel} op={op}"
    data = pattern(comm.rank, numel, dtype)
    if op == "avg" and not dtype.is_floating_point:
        # gloo has no integer AVG; torch's NCCL semantics: sum, then truncating division.
        want = data.clone()
        dist.all_reduce(want, group=comm.group)
        want = torch.div(want, k, rounding_mode="trunc")
    else:
        want = data.clone()
        dist.all_reduce(want, op=TORCH_OPS[op], group=comm.group)
    # avg divides a sum: the division may round differently from torch's in low precision.
    tol = {} if op == "avg" else {"rtol": 0, "atol": 0}
    out = torch.full_like(data, 99)
    got_out = all_reduce(data, comm, op=op, algorithm=algorithm, out=out)
    errors = [
        mismatch(f"{name} out-of-place", got_out, want, **tol),
        mismatch(f"{name} input kept", data, pattern(comm.rank, numel, dtype), rtol=0, atol=0),
    ]
    in_place = data.clone()
    all_reduce(in_place, comm, op=op, algorithm=algorithm)
    errors.append(mismatch(f"{name} in-place", in_place, want, **tol))
    return [e for e in errors if e]


def check_random_floats(algorithm: str) -> list[str]:
    """Realistic data: random float32 of a large odd length, against torch with fp32 tolerance."""
    errors = []
    for k in (2, 3, 5, 8):
        comm = prefix_communicator(k)
        if comm is None:
            continue
        g = torch.Generator().manual_seed(comm.rank)
        data = torch.randn(100_003, generator=g)
        want = data.clone()
        dist.all_reduce(want, group=comm.group)
        all_reduce(data, comm, algorithm=algorithm)
        # Summation order differs from gloo's: allow float32 rounding of an 8-term sum.
        err = mismatch(f"{algorithm} N={k} randn", data, want, rtol=1e-5, atol=1e-5)
        if err:
            errors.append(err)
    return errors


def check_non_contiguous(algorithm: str) -> list[str]:
    comm = prefix_communicator(4)
    if comm is None:
        return []
    base = pattern(comm.rank, 64, torch.float32).view(8, 8)
    view = base.t()  # non-contiguous
    want = view.contiguous()
    dist.all_reduce(want, group=comm.group)
    all_reduce(view, comm, algorithm=algorithm)
    err = mismatch(f"{algorithm} non-contiguous", view, want, rtol=0, atol=0)
    return [err] if err else []


@pytest.mark.parametrize("algorithm", list(ALGORITHMS))
def test_equals_torch_all_reduce(ranks8, algorithm):
    per_rank = ranks8.run(check_algorithm_against_torch, algorithm)
    per_rank += ranks8.run(check_random_floats, algorithm)
    per_rank += ranks8.run(check_non_contiguous, algorithm)
    errors = [e for rank_errors in per_rank for e in rank_errors]
    assert not errors, "\n".join(errors[:20])


def test_unknown_algorithm_names_allowed_values():
    with pytest.raises(ValueError, match="allowed values: parameter_server"):
        all_reduce(torch.zeros(1), comm=None, algorithm="butterfly")


def test_unknown_op_names_allowed_values():
    with pytest.raises(ValueError, match="allowed values: sum, avg, max"):
        all_reduce(torch.zeros(1), comm=None, op="prod")
