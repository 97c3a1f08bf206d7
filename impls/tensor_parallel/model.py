"""The whole GPT under Megatron tensor parallelism, and its analytic communication.

`parallelize_gpt` swaps, in place, every block's attention and MLP for their head- and
hidden-split versions, the token embedding for the vocab-parallel one and the LM head for
a vocab-split column layer; LayerNorms, the position embedding and the row layers' biases
stay replicated (each rank computes the same gradient for them). The model's `forward`
then returns this rank's (b, s, V/t) logits, and `tp_loss` the full cross-entropy.

Communication (Megatron-LM, arXiv 1909.08053, §3): per transformer block, one all-reduce
of the (b, s, h) activations after attention and one after the MLP in forward (`g`), and
one each for their input gradients in backward (`f`). A ring all-reduce of M bytes sends
2(t−1)/t·M per rank in 2(t−1) rounds (`impls.collectives.ring`).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

from impls.comm import Communicator
from impls.models import GPT, GPTConfig
from impls.tensor_parallel.attention import ParallelSelfAttention
from impls.tensor_parallel.embedding import (
    VocabParallelEmbedding,
    parallel_lm_head,
    vocab_parallel_cross_entropy,
)
from impls.tensor_parallel.layers import check_divisible
from impls.tensor_parallel.mlp import ParallelFeedForward

__all__ = [
    "LAYERS",
    "TPComm",
    "analytic_comm",
    "analytic_gpt_comm",
    "check_tp_config",
    "parallelize_gpt",
    "sharded_dims",
    "tp_loss",
]

LAYERS = ("attention", "mlp", "block")


def check_tp_config(cfg: GPTConfig, tp: int) -> None:
    """Refuse a TP degree the GPT cannot be split by, naming the `GPTConfig` key.

    Heads split attention (and with it d_model = n_heads · head_dim), d_ff splits the MLP,
    vocab_size the embedding and LM head. Cheap and process-free: call it before launching.
    """
    if not isinstance(tp, int) or tp < 1:
        raise ValueError(f"tp={tp!r} must be a positive integer")
    check_divisible("GPTConfig.n_heads", cfg.n_heads, tp)
    check_divisible("GPTConfig.d_ff", cfg.ff_dim, tp)
    check_divisible("GPTConfig.vocab_size", cfg.vocab_size, tp)


def parallelize_gpt(model: GPT, comm: Communicator) -> GPT:
    """Turn `model` (the same full GPT on every rank of `comm`) into this rank's TP shard.

    In place; returns `model`. Parameter names are unchanged, so `sharded_dims` tells for
    each name along which dim it is a block of the full parameter. Tied embeddings stay
    tied: the LM head and the token embedding split the vocabulary the same way.
    """
    check_tp_config(model.cfg, comm.world_size)
    emb = model.embedding
    tied = model.lm_head.weight is emb.tok.weight
    emb.tok = VocabParallelEmbedding.from_module(emb.tok, comm)
    for block in model.blocks:
        block.attn = ParallelSelfAttention.from_module(block.attn, comm)
        block.mlp = ParallelFeedForward.from_module(block.mlp, comm)
    model.lm_head = parallel_lm_head(model.lm_head, comm)
    if tied:
        model.lm_head.weight = emb.tok.weight
    return model


def tp_loss(
    model: nn.Module, idx: torch.Tensor, targets: torch.Tensor, comm: Communicator
) -> torch.Tensor:
    """Mean next-token cross-entropy of a `parallelize_gpt` model (same value on every rank)."""
    return vocab_parallel_cross_entropy(model(idx), targets, comm)


def sharded_dims(model: nn.Module) -> dict[str, int]:
    """{parameter name: dim along which it is this rank's block} for every sharded
    parameter; parameters not listed are replicated across the TP group."""
    dims = {}
    for prefix, module in model.named_modules():
        for name, dim in getattr(module, "tp_shard_dims", {}).items():
            if getattr(module, name, None) is not None:
                dims[f"{prefix}.{name}" if prefix else name] = dim
    return dims


@dataclass(frozen=True)
class TPComm:
    """Analytic traffic of one rank (ring all-reduce), forward and backward."""

    allreduces_fwd: int
    allreduces_bwd: int
    bytes_sent_fwd: int
    bytes_sent_bwd: int
    rounds_fwd: int
    rounds_bwd: int


def _ring(numel: int, tp: int, element_size: int) -> tuple[int, int]:
    """(bytes sent per rank, rounds) of one ring all-reduce of `numel` elements."""
    if numel % tp:
        raise ValueError(f"numel={numel} is not divisible by tp={tp}: per-rank bytes would vary")
    return 2 * (tp - 1) * (numel // tp) * element_size, 2 * (tp - 1)


def analytic_comm(
    batch: int, seq_len: int, d_model: int, tp: int, *, layer: str = "block", element_size: int = 4
) -> TPComm:
    """Traffic per rank of one attention, MLP, or block (both) under TP, from Megatron's
    count: one all-reduce of the (batch, seq_len, d_model) activations per sub-layer each way."""
    if layer not in LAYERS:
        raise ValueError(f"layer={layer!r} is unknown; allowed values: {', '.join(LAYERS)}")
    n = 2 if layer == "block" else 1
    sent, rounds = _ring(batch * seq_len * d_model, tp, element_size)
    return TPComm(n, n, n * sent, n * sent, n * rounds, n * rounds)


def analytic_gpt_comm(cfg: GPTConfig, batch: int, seq_len: int, tp: int) -> TPComm:
    """Traffic per rank of one float32 forward + backward of `tp_loss` on a whole GPT.

    Forward: the embedding's `g` (b·s·h), two per block (b·s·h each), and the
    cross-entropy's max (b·s) and its summed exponentials with target logits (2·b·s).
    Backward: two per block, plus the LM head's `f` (b·s·h); the embedding needs none.
    """
    act_sent, act_rounds = _ring(batch * seq_len * cfg.d_model, tp, 4)
    max_sent, max_rounds = _ring(batch * seq_len, tp, 4)
    pair_sent, pair_rounds = _ring(2 * batch * seq_len, tp, 4)
    blocks = 2 * cfg.n_layers
    return TPComm(
        allreduces_fwd=blocks + 3,
        allreduces_bwd=blocks + 1,
        bytes_sent_fwd=(blocks + 1) * act_sent + max_sent + pair_sent,
        bytes_sent_bwd=(blocks + 1) * act_sent,
        rounds_fwd=(blocks + 1) * act_rounds + max_rounds + pair_rounds,
        rounds_bwd=(blocks + 1) * act_rounds,
    )
