"""A transformer block under Megatron sequence parallelism (Korthikanti et al. 2022,
"Reducing Activation Recomputation in Large Transformer Models", arXiv 2205.05198, §4.2.2).

Tensor parallelism (Shoeybi et al. 2019) leaves LayerNorm, dropout and the residual adds
replicated: every rank stores the whole (b, s, h) activation there. Megatron-SP shards
those regions along the sequence instead, and swaps TP's collectives to match:

    x (b, s/P, h) ─ LN ─ all-gather(seq) ─ QKV (col) ─ attention ─ o_proj (row)
      ─ reduce-scatter(seq) ─ + bias, dropout, + x ─ LN ─ all-gather ─ fc1 (col) ─ GELU
      ─ fc2 (row) ─ reduce-scatter ─ + bias, dropout, + residual  -> (b, s/P, h)

Each TP all-reduce becomes its two halves on either side of the sequence-sharded region:
TP's bytes, 1/P of its replicated activations. The gather's backward is a reduce-scatter
and vice versa (`impls.tensor_parallel.ops`), which takes over TP's `f`.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from impls.comm import Communicator
from impls.models import Block
from impls.models.gpt import Dropout, attention_core
from impls.tensor_parallel.layers import ColumnParallelLinear, check_divisible, shard
from impls.tensor_parallel.ops import (
    _gather_along,
    _reduce_scatter_along,
    all_gather_seq,
    reduce_scatter_seq,
)

__all__ = [
    "MegatronSPBlock",
    "SequenceParallelAttention",
    "SequenceParallelFeedForward",
    "SequenceParallelRowLinear",
    "gathered_linears",
]


class _GatheredLinears(torch.autograd.Function):
    """all-gather(x) along the sequence, then one or more column-parallel linears; keeps
    the (b, s/P, h) shard for backward and gathers it again there."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, comm: Communicator, *weights_biases: torch.Tensor):
        ctx.comm, ctx.n = comm, len(weights_biases) // 2
        ws, bs = weights_biases[: ctx.n], weights_biases[ctx.n :]
        full = _gather_along(x, comm, 1)  # (b, s/P, h) -> (b, s, h)
        ctx.save_for_backward(x, *ws)
        ctx.has_bias = [b is not None for b in bs]
        # (b, s, h) @ (h, out/P) -> (b, s, out/P), one per weight
        return tuple(F.linear(full, w, b) for w, b in zip(ws, bs, strict=True))

    @staticmethod
    def backward(ctx, *grads: torch.Tensor):
        x, *ws = ctx.saved_tensors
        full = _gather_along(x, ctx.comm, 1).flatten(0, 1)  # (b·s, h), gathered again
        grad_full = None
        grad_ws, grad_bs = [], []
        for w, g, has_bias in zip(ws, grads, ctx.has_bias, strict=True):
            g2 = g.flatten(0, 1)  # (b·s, out/P)
            part = g2 @ w  # (b·s, out/P) @ (out/P, h) -> (b·s, h)
            grad_full = part if grad_full is None else grad_full + part
            grad_ws.append(g2.t() @ full)  # (out/P, b·s) @ (b·s, h) -> (out/P, h)
            grad_bs.append(g2.sum(0) if has_bias else None)
        grad_x = _reduce_scatter_along(grad_full.view(x.shape[0], -1, x.shape[2]), ctx.comm, 1)
        return grad_x, None, *grad_ws, *grad_bs


def gathered_linears(
    x: torch.Tensor,
    comm: Communicator,
    layers: tuple[ColumnParallelLinear, ...],
    *,
    regather: bool = True,
) -> tuple[torch.Tensor, ...]:
    """(b, s/P, h) sequence shard -> each column layer applied to the gathered (b, s, h).

    The backward reduce-scatters the summed input gradient (the gather's adjoint, which
    also sums the column layers' partial input gradients, TP's `f`). `regather`: keep
    only the shard for backward and gather it again there; False: all-gather, then the
    layers as they are (autograd keeps the gathered tensor).
    """
    if not regather:
        full = all_gather_seq(x, comm, dim=1)
        return tuple(layer(full) for layer in layers)
    weights = [layer.weight for layer in layers]
    biases = [layer.bias for layer in layers]
    return _GatheredLinears.apply(x, comm, *weights, *biases)


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

    def __init__(self, block: Block, comm: Communicator, *, regather: bool = False) -> None:
        super().__init__()
        self.regather = regather
        attn = block.attn
        check_divisible("n_heads", attn.q_proj.out_features // attn.head_dim, comm.world_size)
        self.comm = comm
        self.head_dim, self.dropout = attn.head_dim, attn.dropout
        self.attention, self.recompute = attn.attention, attn.recompute
        self.q_proj, self.k_proj, self.v_proj = (
            _column(lin, comm) for lin in (attn.q_proj, attn.k_proj, attn.v_proj)
        )
        self.o_proj = SequenceParallelRowLinear(attn.o_proj, comm)
        self.resid_drop = Dropout(attn.resid_drop.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's (b, s/P, h) shard of the LayerNorm output -> its (b, s/P, h) output."""
        # all-gather, then (b, s, h) @ (h, h/P) -> (b, s, nh/P, hd) -> (b, nh/P, s, hd)
        projections = gathered_linears(
            x, self.comm, (self.q_proj, self.k_proj, self.v_proj), regather=self.regather
        )
        b, s, _ = projections[0].shape
        q, k, v = (t.view(b, s, -1, self.head_dim).transpose(1, 2) for t in projections)
        y = attention_core(
            q,
            k,
            v,
            attention=self.attention,
            recompute=self.recompute,
            dropout=self.dropout if self.training else 0.0,
        )
        y = y.transpose(1, 2).reshape(b, s, -1)  # (b, s, h/P)
        # Dropout runs on the sequence shard: the region Megatron-SP de-duplicates.
        return self.resid_drop(self.o_proj(y))  # (b, s/P, h)


class SequenceParallelFeedForward(nn.Module):
    """MLP of a Megatron-SP block: ff/P hidden units over the whole (gathered) sequence."""

    def __init__(self, block: Block, comm: Communicator, *, regather: bool = False) -> None:
        super().__init__()
        self.regather = regather
        mlp = block.mlp
        self.comm = comm
        self.fc1 = _column(mlp.fc1, comm)  # (b, s, h) -> (b, s, ff/P)
        self.act = nn.GELU(approximate=mlp.act.approximate)
        self.fc2 = SequenceParallelRowLinear(mlp.fc2, comm)  # (b, s, ff/P) -> (b, s/P, h)
        self.drop = Dropout(mlp.drop.p)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """This rank's (b, s/P, h) shard of the LayerNorm output -> its (b, s/P, h) output."""
        (hidden,) = gathered_linears(x, self.comm, (self.fc1,), regather=self.regather)
        return self.drop(self.fc2(self.act(hidden)))


class MegatronSPBlock(nn.Module):
    """`impls.models.Block` under tensor + sequence parallelism of degree P = group size.

    Input and output: this rank's (b, s/P, h) sequence chunk. Parameter names match
    `Block`'s; `impls.tensor_parallel.sharded_dims(block)` names the sharded ones.
    `regather`: keep the column layers' input shards only, gathering them again in
    backward (Megatron-LM's choice, the paper's 34·s·b·h/P).

    LayerNorm weights and the row layers' biases are replicated and see only this rank's
    positions: sum their gradients over the group with `all_reduce_replicated_grads`.
    Sequence lengths that P does not divide are end-padded by `common.shard_sequence`: after
    the all-gather attention runs on the padded sequence, where the causal mask hides the
    padded keys from every real query, and every other operation is per position.

    With `regather=True` the column layers after each all-gather keep only this rank's
    (b, s/P, h) shard of their input for backward and all-gather it again there
    (`gathered_linears`, as Megatron-LM's `LinearWithGradAccumulationAndAsyncCommunication`
    does under sequence parallelism): the saved activations are then the paper's 34·s·b·h/P
    per layer instead of 4·s·b·h·(1 − 1/P) more, for two more all-gathers in backward.
    Recomputation (`Block.recompute`) carries over: "full" recomputes the whole block from
    its input shard (its collectives run again in backward, on every rank alike),
    "selective" the attention core's s² part.
    """

    def __init__(self, block: Block, comm: Communicator, *, regather: bool = False) -> None:
        super().__init__()
        self.comm = comm
        self.recompute = block.recompute
        self.ln1 = _replica(block.ln1)
        self.attn = SequenceParallelAttention(block, comm, regather=regather)
        self.ln2 = _replica(block.ln2)
        self.mlp = SequenceParallelFeedForward(block, comm, regather=regather)

    @classmethod
    def from_block(
        cls, block: Block, comm: Communicator, *, regather: bool = False
    ) -> MegatronSPBlock:
        """This rank's part of a full `block` (identical on every rank)."""
        return cls(block, comm, regather=regather)

    def replicated_parameters(self) -> list[nn.Parameter]:
        """Parameters every rank holds whole, whose gradients must be summed over ranks."""
        held = (
            self.ln1.weight,
            self.ln1.bias,
            self.ln2.weight,
            self.ln2.bias,
            self.attn.o_proj.bias,
            self.mlp.fc2.bias,
        )
        return [p for p in held if p is not None]

    # Block's: under recompute="full", keep the input shard and run `body` again in backward
    forward = Block.forward

    def body(self, x: torch.Tensor) -> torch.Tensor:
        """The block's computation, kept or recomputed as `forward` decides."""
        # (b, s/P, h) -> LN -> all-gather -> (b, s, h) -> attention -> reduce-scatter -> (b, s/P, h)
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


def _replica(norm: nn.LayerNorm) -> nn.LayerNorm:
    copy = nn.LayerNorm(norm.normalized_shape, eps=norm.eps, bias=norm.bias is not None)
    copy.load_state_dict(norm.state_dict())
    return copy
