"""Helpers that run *inside* pool ranks: sub-groups of the first k ranks, and comparisons."""

from __future__ import annotations

import torch
import torch.distributed as dist

from impls.comm import Communicator

_GROUPS: dict[int, object] = {}


def prefix_communicator(k: int) -> Communicator | None:
    """A communicator over global ranks 0..k-1 (None on the other ranks).

    Every rank of the pool must call this with the same k in the same order, since
    creating a process group is itself collective. Groups are cached per process.
    """
    if k not in _GROUPS:
        _GROUPS[k] = dist.new_group(list(range(k)))
    return Communicator(_GROUPS[k]) if dist.get_rank() < k else None


def pattern(rank: int, numel: int, dtype: torch.dtype, seed: int = 0) -> torch.Tensor:
    """Small integers, so sums over ≤ 8 ranks are exact in every dtype (bf16 included):
    any mismatch with torch is then a real error, not rounding."""
    g = torch.Generator().manual_seed(seed * 1009 + rank)
    return torch.randint(-8, 9, (numel,), generator=g).to(dtype)


def mismatch(name: str, got: torch.Tensor, want: torch.Tensor, **tol) -> str | None:
    try:
        torch.testing.assert_close(got, want, **tol)
    except AssertionError as err:
        return f"{name}: {str(err).splitlines()[0]}"
    return None
