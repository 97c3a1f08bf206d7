"""Column- and row-parallel linear layers (Megatron-LM, Shoeybi et al., arXiv 1909.08053, §3).

A linear layer Y = X Wᵀ + b (W: out × in) splits two ways over t ranks:

- column-parallel: rank r keeps output features [r·out/t, (r+1)·out/t) — rows of W and the
  matching slice of b — and computes its slice of Y from the whole X;
- row-parallel: rank r keeps input features [r·in/t, (r+1)·in/t) — columns of W — so from
  its slice of X it computes a partial Y that the ranks sum (`g`); b, replicated, is added
  once after the sum.

Column then row needs no communication in between: that is the parallel MLP.
Both layers are built from a full `nn.Linear` that every rank holds identically (built from
the same seed), and keep only their shard. `tp_shard_dims` records, per parameter, the dim
along which it is a shard of the full one (missing: replicated), so tests and the hybrid
mesh can match shards with full tensors."""

from __future__ import annotations

from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn

from impls.comm import Communicator
from impls.models._checks import divisors
from impls.tensor_parallel.ops import copy_to_tp, gather_from_tp, reduce_from_tp, scatter_to_tp

__all__ = ["ColumnParallelLinear", "RowParallelLinear", "check_divisible", "shard"]


def check_divisible(key: str, value: int, tp: int) -> None:
    """Refuse a size that t ranks cannot split evenly, naming the key and the allowed t."""
    if value % tp:
        allowed = divisors(value)
        raise ValueError(f"{key}={value} is not divisible by tp={tp}; allowed tp: {allowed}")


def shard(tensor: torch.Tensor, dim: int, rank: int, tp: int) -> torch.Tensor:
    """A detached copy of block `rank` of `tp` equal blocks of `tensor` along `dim`."""
    size = tensor.shape[dim] // tp
    return tensor.detach().narrow(dim, rank * size, size).clone()


class ColumnParallelLinear(nn.Module):
    """Output features split over the TP group: weight (out/t, in), bias (out/t).

    Input: the whole X, replicated. Output: this rank's out/t features, or all `out`
    features if `gather_output` (an all-gather). `reduce_input_grad` applies `f` to the
    input (an all-reduce of its gradient in backward); a caller that feeds one input to
    several column layers (q, k and v) applies `f` once itself and passes False.
    """

    tp_shard_dims: ClassVar[dict[str, int]] = {"weight": 0, "bias": 0}

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        comm: Communicator,
        *,
        gather_output: bool = False,
        reduce_input_grad: bool = True,
    ) -> None:
        super().__init__()
        self.comm = comm
        self.gather_output = gather_output
        self.reduce_input_grad = reduce_input_grad
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    @classmethod
    def from_linear(
        cls,
        linear: nn.Linear,
        comm: Communicator,
        gather_output: bool = False,
        *,
        reduce_input_grad: bool = True,
    ) -> ColumnParallelLinear:
        """This rank's column shard of a full `linear` (identical on every rank)."""
        t, r = comm.world_size, comm.rank
        check_divisible("out_features", linear.out_features, t)
        bias = shard(linear.bias, 0, r, t) if linear.bias is not None else None
        return cls(
            shard(linear.weight, 0, r, t),
            bias,
            comm,
            gather_output=gather_output,
            reduce_input_grad=reduce_input_grad,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.reduce_input_grad:
            x = copy_to_tp(x, self.comm)
        y = F.linear(x, self.weight, self.bias)  # (b, s, in) @ (in, out/t) -> (b, s, out/t)
        return gather_from_tp(y, self.comm, dim=-1) if self.gather_output else y

    def extra_repr(self) -> str:
        out_part, in_features = self.weight.shape
        return (
            f"in_features={in_features}, out_features_per_rank={out_part}, "
            f"tp={self.comm.world_size}, gather_output={self.gather_output}"
        )


class RowParallelLinear(nn.Module):
    """Input features split over the TP group: weight (out, in/t), bias (out) replicated.

    Input: this rank's in/t features (`input_is_parallel`), or the whole X, of which the
    layer keeps its slice. Output: the whole Y on every rank, summed over ranks by `g`
    (one all-reduce forward, none backward), plus the bias added once after the sum.
    """

    tp_shard_dims: ClassVar[dict[str, int]] = {"weight": 1}

    def __init__(
        self,
        weight: torch.Tensor,
        bias: torch.Tensor | None,
        comm: Communicator,
        *,
        input_is_parallel: bool = True,
    ) -> None:
        super().__init__()
        self.comm = comm
        self.input_is_parallel = input_is_parallel
        self.weight = nn.Parameter(weight)
        self.bias = nn.Parameter(bias) if bias is not None else None

    @classmethod
    def from_linear(
        cls, linear: nn.Linear, comm: Communicator, input_is_parallel: bool = True
    ) -> RowParallelLinear:
        """This rank's row shard of a full `linear` (identical on every rank)."""
        t, r = comm.world_size, comm.rank
        check_divisible("in_features", linear.in_features, t)
        bias = linear.bias.detach().clone() if linear.bias is not None else None
        return cls(shard(linear.weight, 1, r, t), bias, comm, input_is_parallel=input_is_parallel)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.input_is_parallel:
            x = scatter_to_tp(x, self.comm, dim=-1)
        partial = F.linear(x, self.weight)  # (b, s, in/t) @ (in/t, out) -> (b, s, out)
        y = reduce_from_tp(partial, self.comm)
        return y + self.bias if self.bias is not None else y

    def extra_repr(self) -> str:
        out_features, in_part = self.weight.shape
        return (
            f"in_features_per_rank={in_part}, out_features={out_features}, "
            f"tp={self.comm.world_size}, input_is_parallel={self.input_is_parallel}"
        )
