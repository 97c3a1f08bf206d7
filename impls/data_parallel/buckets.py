"""Gradient buckets: which parameters' gradients are all-reduced together.

One all-reduce per parameter pays the per-message latency (α) hundreds of times; one for
the whole model cannot start before backward ends. Buckets sit in between (Li et al.,
VLDB 2020, "PyTorch Distributed: Experiences on Accelerating Data Parallel Training"):
parameters are taken in *reverse* registration order — the order backward produces their
gradients — and packed greedily up to `bucket_cap_bytes`, so the first bucket fills while
most of backward is still ahead.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

__all__ = ["Bucket", "assign_buckets"]


def assign_buckets(
    nbytes: Sequence[int], dtypes: Sequence[torch.dtype], bucket_cap_bytes: int
) -> list[list[int]]:
    """Indices of the parameters in each bucket, first bucket first.

    Parameters are visited last to first; a bucket closes when the next parameter would
    take it past the cap or has another dtype (a buffer has one dtype). A parameter larger
    than the cap gets a bucket of its own, so every cap works.
    """
    if isinstance(bucket_cap_bytes, bool) or not isinstance(bucket_cap_bytes, int):
        raise ValueError(f"bucket_cap_bytes={bucket_cap_bytes!r} must be a positive integer")
    if bucket_cap_bytes <= 0:
        raise ValueError(f"bucket_cap_bytes={bucket_cap_bytes} must be a positive integer")
    buckets: list[list[int]] = []
    size = 0
    for i in reversed(range(len(nbytes))):
        fits = (
            buckets and size + nbytes[i] <= bucket_cap_bytes and dtypes[i] == dtypes[buckets[-1][0]]
        )
        if fits:
            buckets[-1].append(i)
            size += nbytes[i]
        else:
            buckets.append([i])
            size = nbytes[i]
    return buckets


class Bucket:
    """One flat gradient buffer and the parameters whose gradients are views of it."""

    def __init__(self, index: int, members: list[int], params: Sequence[nn.Parameter]) -> None:
        self.index = index
        self.members = members
        dtype = params[members[0]].dtype
        self.buffer = torch.zeros(sum(params[i].numel() for i in members), dtype=dtype)
        self.views: dict[int, torch.Tensor] = {}
        offset = 0
        for i in members:
            n = params[i].numel()
            self.views[i] = self.buffer[offset : offset + n].view_as(params[i])
            offset += n
        self.nbytes = self.buffer.numel() * self.buffer.element_size()
        self.pending = len(members)
        self.ready = self.started = self.finished = 0.0

    def reset(self) -> None:
        """Forget the last step: wait for every member's gradient again."""
        self.pending = len(self.members)
        self.ready = self.started = self.finished = 0.0
