"""What a `sequence_parallel` cell is predicted to move and save, derived once per cell.

- communication per link per layer: `impls.sequence_parallel.analytic.layer_traffic`, the
  papers' volumes with the exact (P − 1)/P factors of ring and all-to-all collectives —
  Korthikanti et al. 2022 (arXiv 2205.05198, §4.2.2) for Megatron-SP, Jacobs et al. 2023
  (arXiv 2309.14509, §3.2) for Ulysses, Liu et al. 2023 (arXiv 2310.01889, §3) for Ring
  Attention;
- activation bytes per rank, twice: the paper formula `analytic.activation_bytes_per_rank`
  (Korthikanti et al. Table 2: 16-bit activations, dropout masks, materialised attention
  scores), and `implementation_activation_bytes`, the same tensor-by-tensor accounting
  applied to what this code saves. The second is the model the measured rows check; the
  longest sequence within the memory budget comes from it (and, labelled, from the
  paper formula).

Light on purpose: rank processes unpickle a cell's `Plan` from here."""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from impls.models import GPTConfig
from impls.sequence_parallel.analytic import (
    LayerTraffic,
    activation_bytes_per_rank,
    layer_traffic,
)

__all__ = ["FP32", "Plan", "implementation_activation_bytes", "longest_seq_len", "plan"]

FP32 = 4  # bytes per element: every cell runs in float32


@dataclass(frozen=True)
class Plan:
    """A cell's `carry`: its block and everything predicted for it, built once."""

    block: GPTConfig
    """One block of the cell's sequence length (the ranks build it; `n_layers` = 1)."""
    layers: int
    """The depth the memory-budget figure assumes (the model's `n_layers`)."""
    traffic: LayerTraffic
    """The papers' per-link formula for this method, P and s."""
    model_bytes: int
    """Activation bytes per rank by the implementation model."""
    paper_bytes: int
    """Activation bytes per rank by Korthikanti et al.'s Table 2."""
    longest: int
    """Longest s whose activations for `layers` blocks fit the budget (implementation model)."""
    paper_longest: int
    """The same from the paper formula."""


def implementation_activation_bytes(
    method: str, *, sp: int, batch: int, seq_len: int, d_model: int, n_heads: int, d_ff: int
) -> int:
    """Bytes one block of this implementation saves for backward per rank, fp32.

    Korthikanti et al.'s accounting (arXiv 2205.05198, §4.1), tensor by tensor, applied to
    this code, with L = ceil(s/P) positions per rank and S = P·L (padding included):

    - every method: LayerNorm mean and rstd, 2·b·L per LayerNorm; torch's fused causal
      attention keeps q, k, v, its output and one log-sum-exp per query and head — never
      the s × s scores — for a/P heads over S positions (Megatron-SP, Ulysses) or all
      heads over L (Ring Attention): 4·b·L·h + a·b·L either way; the MLP keeps fc1's and
      GELU's outputs, 2·b·L·d_ff (Megatron-SP: d_ff/P units over S positions, the same);
    - Megatron-SP: the block input and the residual (b·L·h each) and the all-gathered
      inputs of QKV and fc1, b·S·h each — kept whole, where the paper re-gathers them in
      backward (§4.2.3), so this term does not shrink with P;
    - Ulysses: block input, LayerNorm output, residual, ln2 output (b·L·h each), and for
      P > 1 o_proj's input, the all-to-all's fresh copy (at P = 1 o_proj reads the
      attention output in place);
    - Ring Attention: as Ulysses, o_proj's input always a copy (the ring's output is
      re-laid out from heads to positions).
    """
    b, h, a = batch, d_model, n_heads
    local = math.ceil(seq_len / sp)
    padded = sp * local
    shared = 4 * b * local + 4 * b * local * h + a * b * local + 2 * b * local * d_ff
    if method == "megatron_sp":
        held = 2 * b * local * h + 2 * b * padded * h
    elif method == "ulysses":
        held = (4 + (sp > 1)) * b * local * h
    else:
        held = 5 * b * local * h
    return FP32 * (shared + held)


def longest_seq_len(
    activation_bytes: Callable[[int], int], budget_bytes: int, layers: int, limit: int = 1 << 40
) -> int:
    """The largest s with layers · activation_bytes(s) ≤ budget (0 if even s = 1 does not
    fit); `activation_bytes` must not decrease with s."""
    if layers * activation_bytes(1) > budget_bytes:
        return 0
    low, high = 1, 2
    while high < limit and layers * activation_bytes(high) <= budget_bytes:
        low, high = high, 2 * high
    while high - low > 1:  # layers · f(low) fits, layers · f(high) does not
        mid = (low + high) // 2
        if layers * activation_bytes(mid) <= budget_bytes:
            low = mid
        else:
            high = mid
    return low


def plan(
    method: str, sp: int, seq_len: int, *, model: dict[str, Any], batch: int, budget_bytes: int
) -> Plan:
    """The cell's block and its predictions: traffic, activation bytes, longest s."""
    block = GPTConfig(**{**model, "seq_len": seq_len, "n_layers": 1})
    layers = GPTConfig(**model, seq_len=seq_len).n_layers
    shape = {"batch": batch, "d_model": block.d_model, "n_heads": block.n_heads}

    def modelled(s: int) -> int:
        return implementation_activation_bytes(method, sp=sp, seq_len=s, d_ff=block.ff_dim, **shape)

    def paper(s: int) -> int:
        return activation_bytes_per_rank(method, sp=sp, seq_len=s, **shape)

    traffic = layer_traffic(
        method, sp=sp, seq_len=seq_len, batch=batch, d_model=block.d_model, bytes_per_element=FP32
    )
    return Plan(
        block=block,
        layers=layers,
        traffic=traffic,
        model_bytes=modelled(seq_len),
        paper_bytes=paper(seq_len),
        longest=longest_seq_len(modelled, budget_bytes, layers),
        paper_longest=longest_seq_len(paper, budget_bytes, layers),
    )
