"""Reduction operators shared by every reducing collective, and input validation.

`avg` is computed as a sum followed by one division by the group size at the end (as
torch.distributed does), so every algorithm rounds the same way; on integer tensors the
division truncates toward zero, matching torch.distributed's gloo and NCCL backends.
"""

from __future__ import annotations

import torch

__all__ = ["REDUCE_OPS", "check_op", "combine", "combine_into", "finish"]

REDUCE_OPS = ("sum", "avg", "max")


def check_op(op: str) -> str:
    if op not in REDUCE_OPS:
        raise ValueError(f"op={op!r} is not a reduction; allowed values: {', '.join(REDUCE_OPS)}")
    return op


def combine(acc: torch.Tensor, incoming: torch.Tensor, op: str) -> None:
    """acc ⊕= incoming, in place (avg accumulates a sum; `finish` divides)."""
    if op == "max":
        torch.maximum(acc, incoming, out=acc)
    else:
        acc.add_(incoming)


def combine_into(out: torch.Tensor, a: torch.Tensor, b: torch.Tensor, op: str) -> None:
    """out = a ⊕ b (out may alias a or b)."""
    if op == "max":
        torch.maximum(a, b, out=out)
    else:
        torch.add(a, b, out=out)


def finish(result: torch.Tensor, op: str, world_size: int) -> None:
    """Turn an accumulated sum into an average, in place; other ops are already final."""
    if op != "avg" or world_size == 1:
        return
    if result.is_floating_point():
        result.div_(world_size)
    else:
        result.copy_(torch.div(result, world_size, rounding_mode="trunc"))
