"""Ulysses and Ring Attention equal full causal attention, and move what their papers say.

A failure means a sequence-parallel attention layer computes different outputs or
gradients than the single-process `CausalSelfAttention` (a block attended out of causal
order, an all-to-all that puts a head or a position in the wrong place, a K/V gradient
that does not make it home, padding that leaks into a real position), or that its
measured traffic differs from the analytic volume in `analytic.layer_traffic`.
"""

from __future__ import annotations

import pytest

from tests.sequence_parallel.sp_ranks import Case, run_cases

# Even lengths for P = 1, 2, 4, and lengths P does not divide (end-padded), including one
# shorter than P (a rank holding only padding).
CASES = [
    Case(method, sp, seq_len)
    for method in ("ulysses", "ring_attention")
    for sp, seq_len in [(1, 8), (1, 7), (2, 8), (2, 7), (4, 8), (4, 12), (4, 10), (4, 3)]
]


@pytest.mark.timeout(120)
def test_equal_full_attention_and_analytic_traffic(ranks8):
    errors = [e for rank_errors in ranks8.run(run_cases, CASES) for e in rank_errors or []]
    assert errors == []
