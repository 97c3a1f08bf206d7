"""Communication and activation volumes of the three sequence-parallel methods, from their
papers, in the exact form this package's implementations move them.

Every count is per rank and per transformer layer, for P ranks holding L = ceil(s/P)
positions each (padding included, since padded positions travel too). "Per link" follows
DeepSpeed-Ulysses (Jacobs et al. 2023, arXiv 2309.14509, §3.2): the bytes one GPU puts on
its link per layer. The papers quote the large-P limit; the counts here keep the exact
(P − 1)/P factors of ring and all-to-all collectives, so they equal the counters. Each method's count: `layer_traffic`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["METHODS", "LayerTraffic", "activation_bytes_per_rank", "layer_traffic"]

METHODS = ("megatron_sp", "ulysses", "ring_attention")


@dataclass(frozen=True)
class LayerTraffic:
    """What one rank sends (and, by symmetry, receives) in one layer, and in how many rounds."""

    method: str
    bytes_fwd: int
    bytes_bwd: int
    rounds_fwd: int
    rounds_bwd: int

    @property
    def bytes_per_link(self) -> int:
        """Forward plus backward bytes on this rank's link: the papers' per-link volume."""
        return self.bytes_fwd + self.bytes_bwd


def _check(method: str, sp: int, **sizes: int) -> None:
    if method not in METHODS:
        raise ValueError(f"method={method!r} is unknown; allowed: {list(METHODS)}")
    for key, value in {"sp": sp, **sizes}.items():
        if not isinstance(value, int) or value < 1:
            raise ValueError(f"{key} must be a positive int, got {value!r}")


def layer_traffic(
    method: str,
    *,
    sp: int,
    batch: int,
    seq_len: int,
    d_model: int,
    bytes_per_element: int = 4,
    regather: bool = False,
) -> LayerTraffic:
    """Per-rank traffic of one layer: a whole block for Megatron-SP, attention otherwise
    (the other methods' MLP is per-position and needs no communication). `regather`:
    Megatron-SP's `MegatronSPBlock(regather=True)`, two more all-gathers in backward.

    - Megatron-SP (Korthikanti et al. 2022, arXiv 2205.05198, §4.2.2): per block, 2 all-gathers
      of the b·s·h activations forward (before QKV and fc1) and 2 reduce-scatters (after o_proj
      and fc2); backward swaps them, and with `regather` (the column layers keep their input
      shard only) all-gathers those inputs again: 6 collectives backward. A ring all-gather or
      reduce-scatter of b·s·h elements sends (P − 1)/P · b·s·h per rank: 4·b·s·h per link each
      way, constant in P.
    - Ulysses (§3.2): 4 all-to-alls forward (q, k, v in; context out) and 4 backward, each of
      the b·(s/P)·h elements a rank holds, (P − 1)/P of which leave it: O(1/P) per link.
    - Ring Attention (Liu et al. 2023, arXiv 2310.01889, §3): forward passes P − 1 K/V blocks
      of 2·b·(s/P)·h; our backward passes P − 1 K/V blocks and P dK/dV blocks (see
      `ring_attention`), 2P − 1 blocks of 2·b·(s/P)·h in all: O(1) per link, like Megatron-SP.
    """
    _check(method, sp, batch=batch, seq_len=seq_len, d_model=d_model)
    chunk = batch * math.ceil(seq_len / sp) * d_model * bytes_per_element  # b·L·h bytes
    if sp == 1:
        return LayerTraffic(method, 0, 0, 0, 0)
    if method == "megatron_sp":
        # Ring all-gather / reduce-scatter of P chunks: P − 1 rounds of one chunk each.
        per_collective, rounds = (sp - 1) * chunk, sp - 1
        bwd = 6 if regather else 4
        return LayerTraffic(
            method, 4 * per_collective, bwd * per_collective, 4 * rounds, bwd * rounds
        )
    if method == "ulysses":
        # All-to-all: P − 1 of a rank's P blocks leave it, in one round.
        per_collective = (sp - 1) * chunk // sp
        return LayerTraffic(method, 4 * per_collective, 4 * per_collective, 4, 4)
    kv_block = 2 * chunk  # one K and one V block
    # Forward: P − 1 hops of K/V. Backward: K/V again (P − 1) plus dK/dV (P hops, the last
    # one returning each block's total to its owner), in P + 1 rounds.
    return LayerTraffic(method, (sp - 1) * kv_block, (2 * sp - 1) * kv_block, sp - 1, sp + 1)


def activation_bytes_per_rank(
    method: str, *, sp: int, batch: int, seq_len: int, d_model: int, n_heads: int
) -> int:
    """Activation bytes one transformer layer keeps per rank for backward (theory).

    Korthikanti et al. 2022 (arXiv 2205.05198, Table 2, the row with tensor and sequence
    parallelism of degree t, 16-bit activations, 1-byte dropout masks): s·b·h·(34/t +
    5·a·s/(h·t)), where 34·s·b·h counts the per-position tensors and 5·a·s²·b the attention
    scores, softmax and dropout mask. Ulysses shards both terms by P too (positions outside
    attention, heads inside). Ring Attention shards the positions by P and never stores the
    scores: it holds one (s/P) × (s/P) block of them at a time, 5·a·b·(s/P)².
    """
    _check(method, sp, batch=batch, seq_len=seq_len, d_model=d_model, n_heads=n_heads)
    s, b, h, a = math.ceil(seq_len / sp) * sp, batch, d_model, n_heads
    per_position = 34 * s * b * h // sp
    if method == "ring_attention":
        return per_position + 5 * a * b * (s // sp) ** 2
    return per_position + 5 * a * s * s * b // sp
