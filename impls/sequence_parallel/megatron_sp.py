"""A transformer block under Megatron sequence parallelism (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198, §4.2.2).

Tensor parallelism (Shoeybi et al. 2019) shards attention by heads and the MLP by hidden
units, but leaves LayerNorm, dropout and the residual adds replicated: every rank stores
the whole (b, s, h) activation there. Megatron-SP shards those regions along the sequence
instead, and swaps TP's collectives to match:

    x (b, s/P, h) ─ LN ─ all-gather(seq) ─ QKV (col) ─ attention ─ o_proj (row)
      ─ reduce-scatter(seq) ─ + bias, dropout, + x ─ LN ─ all-gather ─ fc1 (col) ─ GELU
      ─ fc2 (row) ─ reduce-scatter ─ + bias, dropout, + residual  -> (b, s/P, h)

An all-reduce is a reduce-scatter followed by an all-gather, so each TP all-reduce becomes
the same two halves on either side of the sequence-sharded region: the same bytes as TP,
with 1/P of its replicated activations. The gather's backward is a reduce-scatter and the
reduce-scatter's an all-gather (`impls.tensor_parallel.ops`), which also takes over the
job of TP's `f` (summing the input gradient of the column-parallel layers).

LayerNorm weights and the row layers' biases are replicated and see only this rank's
positions: sum their gradients over the group with `all_reduce_replicated_grads`.
Sequence lengths that P does not divide are end-padded by `common.shard_sequence`: after
the all-gather attention runs on the padded sequence, where the causal mask hides the
padded keys from every real query, and every other operation is per position.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from impls.comm import Communicator
from impls.models import Block
from impls.tensor_parallel.layers import ColumnParallelLinear, check_divisible, shard
from impls.tensor_parallel.ops import all_gather_seq, reduce_scatter_seq

__all__ = [
    "MegatronSPBlock",
    "SequenceParallelAttention",
    "SequenceParallelFeedForward",
    "SequenceParallelRowLinear",
]


def _column(linear: nn.Linear, comm: Communicator) -> ColumnParallelLinear:
    # No `f`: the all-gather before it reduce-scatters the input gradient in backward.
    return ColumnParallelLinear.from_linear(linear, comm, reduce_input_grad=False)


class SequenceParallelRowLinear(nn.Module):
    """Row-parallel linear whose partial outputs are reduce-scattered along the sequence.

    (b, s, in/P) -> (b, s/P, out): weight (out, in/P) is this rank's shard; the bias is
    replicated and added after the reduction, to the rank's positions only.
    """

    tp_shard_dims = {"weight": 1}  # read by `impls.tensor_parallel.sharded_dims`

    def __init__(self, linear: nn.Linear, comm: Communicator) -> None:
        super().__init__()
        check_divisible("in_features", linear.in_features, comm.world_size)
        self.comm = comm
        self.weight = nn.Parameter(shard(linear.weight, 1, comm.rank, comm.world_size))
        self.bias = None if linear.bias is None else nn.Parameter(linear.bias.detach().clone())

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        partial = F.linear(x, self.weight)  # (b, s, in/P) @ (in/P, out) -> (b, s, out)
        y = reduce_scatter_seq(partial, self.comm, dim=1)  # -> summed (b, s/P, out)
        return y if self.bias is None else y + self.bias


class SequenceParallelAttention(nn.Module):
    """Attention of a Megatron-SP block: nh/P heads over the whole (gathered) sequence."""

    def __init__(self, block: Block, comm: Communicator) -> None:
        super().__init__()
        attn = block.attn
        check_divisible("n_heads", attn.q_proj.out_features // attn.head_dim, comm.world_size)
        self.comm = comm
        self.head_dim, self.dropout = attn.head_dim, attn.dropout
        self.q_proj, self.k_proj, self.v_proj = (
            _column(lin, comm) for lin in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        self.o_proj = SequenceParallelRowLinear(attn.o_proj, comm)
        self.resid_drop = nn.Dropout(attn.resid_drop.p)

    def forward(self, x_full: torch.Tensor) -> torch.Tensor:
        b, s, _ = x_full.shape
        # (b, s, h) @ (h, h/P) -> (b, s, nh/P, hd) -> (b, nh/P, s, hd)
        q, k, v = (
            proj(x_full).view(b, s, -1, self.head_dim).transpose(1, 2)
            for proj in (self.q_proj, self.k_proj, self.v_proj)
        )
        p = self.dropout if self.training else 0.0
        y = F.scaled_dot_product_attention(q, k, v, dropout_p=p, is_causal=True)
        y = y.transpose(1, 2).reshape(b, s, -1)  # (b, s, h/P)
        # Dropout runs on the sequence shard: the region Megatron-SP de-duplicates.
        return self.resid_drop(self.o_proj(y))  # (b, s/P, h)


class SequenceParallelFeedForward(nn.Module):
    """MLP of a Megatron-SP block: ff/P hidden units over the whole (gathered) sequence."""

    def __init__(self, block: Block, comm: Communicator) -> None:
        super().__init__()
        mlp = block.mlp
        self.fc1 = _column(mlp.fc1, comm)  # (b, s, h) -> (b, s, ff/P)
        self.act = nn.GELU(approximate=mlp.act.approximate)
        self.fc2 = SequenceParallelRowLinear(mlp.fc2, comm)  # (b, s, ff/P) -> (b, s/P, h)
        self.drop = nn.Dropout(mlp.drop.p)

    def forward(self, x_full: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.act(self.fc1(x_full))))


class MegatronSPBlock(nn.Module):
    """`impls.models.Block` under tensor + sequence parallelism of degree P = group size.

    Input and output: this rank's (b, s/P, h) sequence chunk. Parameter names match
    `Block`'s; `impls.tensor_parallel.sharded_dims(block)` names the sharded ones.
    """

    def __init__(self, block: Block, comm: Communicator) -> None:
        super().__init__()
        self.comm = comm
        self.ln1 = _replica(block.ln1)
        self.attn = SequenceParallelAttention(block, comm)
        self.ln2 = _replica(block.ln2)
        self.mlp = SequenceParallelFeedForward(block, comm)

    @classmethod
    def from_block(cls, block: Block, comm: Communicator) -> MegatronSPBlock:
        """This rank's part of a full `block` (identical on every rank)."""
        return cls(block, comm)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole, whose gradients must be summed over ranks."""
        held = (self.ln1.weight, self.ln1.bias, self.ln2.weight, self.ln2.bias,
                self.attn.o_proj.bias, self.mlp.fc2.bias)  # fmt: skip
        return [p for p in held if p is not None]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        # (b, s/P, h) -> LN -> all-gather -> (b, s, h) -> attention -> reduce-scatter -> (b, s/P, h)
        x = x + self.attn(all_gather_seq(self.ln1(x), self.comm, dim=1))
        return x + self.mlp(all_gather_seq(self.ln2(x), self.comm, dim=1))


def _replica(norm: nn.LayerNorm) -> nn.LayerNorm:
    copy = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, bias=norm.bias is not None)
    copy.load_state_dict(norm.state_dict())
    return copy
