"""How a flat buffer is cut into per-rank chunks.

Chunk sizes differ by at most one element, so any length works: not divisible by the
group size, a single element (most chunks empty), or empty. Zero-length chunks are
skipped by the algorithms on both sides of a link, since both compute the same split.
"""

from __future__ import annotations

import torch

__all__ = ["even_splits", "flat_view", "halve"]


def even_splits(numel: int, parts: int) -> list[tuple[int, int]]:
    """(offset, length) of `parts` contiguous chunks covering range(numel)."""
    base, extra = divmod(numel, parts)
    spans, offset = [], 0
    for i in range(parts):
        length = base + (1 if i < extra else 0)
        spans.append((offset, length))
        offset += length
    return spans


def halve(offset: int, length: int) -> tuple[tuple[int, int], tuple[int, int]]:
    """Split one span into a lower and an upper half (the lower gets the smaller half)."""
    low = length // 2
    return (offset, low), (offset + low, length - low)


def flat_view(tensor: torch.Tensor) -> torch.Tensor:
    """A 1-D view sharing memory with a contiguous tensor."""
    if not tensor.is_contiguous():
        raise ValueError("collectives work on contiguous tensors; call .contiguous() first")
    return tensor.view(-1)
