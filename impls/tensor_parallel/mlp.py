"""The tensor-parallel MLP (Megatron-LM, arXiv 1909.08053, §3, Fig. 3a).

fc1 is split by columns, so each rank applies GELU to its own ff/t hidden features (GELU
is elementwise: no communication); fc2 is split by rows, so each rank's hidden slice
yields a partial output that one all-reduce sums. Communication per MLP: `g` — one
all-reduce of the (b, s, h) output in forward; `f` — one all-reduce of the (b, s, h) input
gradient in backward.

Dropout on the output acts on the replicated tensor after the sum: with dropout > 0 every
rank of the group must draw the same mask (same RNG state), as Megatron's RNG tracker does.
"""

from __future__ import annotations

import torch
from torch import nn

from impls.comm import Communicator
from impls.models import FeedForward
from impls.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, check_divisible

__all__ = ["ParallelFeedForward"]


class ParallelFeedForward(nn.Module):
    """`FeedForward` with fc1 column-parallel and fc2 row-parallel over the TP group."""

    def __init__(
        self,
        fc1: ColumnParallelLinear,
        act: nn.Module,
        fc2: RowParallelLinear,
        drop: nn.Module,
    ) -> None:
        super().__init__()
        self.fc1, self.act, self.fc2, self.drop = fc1, act, fc2, drop

    @classmethod
    def from_module(cls, ff: FeedForward, comm: Communicator) -> ParallelFeedForward:
        """This rank's shard of a full `FeedForward` (identical on every rank)."""
        check_divisible("d_ff", ff.fc1.out_features, comm.world_size)
        return cls(
            ColumnParallelLinear.from_linear(ff.fc1, comm),
            ff.act,
            RowParallelLinear.from_linear(ff.fc2, comm, input_is_parallel=True),
            ff.drop,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (b, s, h) -> (b, s, ff/t) -> GELU -> (b, s, ff/t) -> partial (b, s, h) -> sum (g)
        return self.drop(self.fc2(self.act(self.fc1(x))))
