"""Tensor-parallel causal self-attention, split by heads (Megatron-LM, arXiv 1909.08053,
§3, Fig. 3b).

Heads are independent, so rank r keeps heads [r·nh/t, (r+1)·nh/t): the matching output
features of q_proj, k_proj and v_proj (column-parallel) and input features of o_proj
(row-parallel). Attention itself runs locally on the rank's heads; o_proj's partial
outputs are summed by one all-reduce (`g`). The replicated input enters through one `f`
shared by q, k and v, so the backward also costs one all-reduce, not three.
"""

from __future__ import annotations

import torch
from torch import nn

from impls.comm import Communicator
from impls.models import CausalSelfAttention
from impls.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear, check_divisible
from impls.tensor_parallel.ops import copy_to_tp

__all__ = ["ParallelSelfAttention"]


class ParallelSelfAttention(nn.Module):
    """`CausalSelfAttention` holding nh/t heads per rank; same attribute names."""

    def __init__(
        self,
        q_proj: ColumnParallelLinear,
        k_proj: ColumnParallelLinear,
        v_proj: ColumnParallelLinear,
        o_proj: RowParallelLinear,
        *,
        head_dim: int,
        dropout: float,
        resid_drop: nn.Module,
        comm: Communicator,
        attention: str = "fused",
        recompute: str = "none",
    ) -> None:
        super().__init__()
        self.q_proj, self.k_proj, self.v_proj, self.o_proj = q_proj, k_proj, v_proj, o_proj
        self.head_dim = head_dim
        self.dropout = dropout
        # read by CausalSelfAttention.forward: the core's mode and selective recomputation
        self.attention, self.recompute = attention, recompute
        self.resid_drop = resid_drop
        self.comm = comm

    @classmethod
    def from_module(cls, attn: CausalSelfAttention, comm: Communicator) -> ParallelSelfAttention:
        """This rank's heads of a full `CausalSelfAttention` (identical on every rank)."""
        n_heads = attn.q_proj.out_features // attn.head_dim
        check_divisible("n_heads", n_heads, comm.world_size)

        def column(linear: nn.Linear) -> ColumnParallelLinear:
            return ColumnParallelLinear.from_linear(linear, comm, reduce_input_grad=False)

        return cls(
            column(attn.q_proj),
            column(attn.k_proj),
            column(attn.v_proj),
            RowParallelLinear.from_linear(attn.o_proj, comm, input_is_parallel=True),
            head_dim=attn.head_dim,
            dropout=attn.dropout,
            resid_drop=attn.resid_drop,
            comm=comm,
            attention=attn.attention,
            recompute=attn.recompute,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # One `f` for q, k and v together, then the full attention's own forward: it reads
        # the same attribute names and infers the head count from q_proj's output, so on
        # this rank it attends over nh/t heads; o_proj (row-parallel) ends with the `g`.
        return CausalSelfAttention.forward(self, copy_to_tp(x, self.comm))
