"""A Megatron-SP block equals the single-process transformer block.

A failure means the sequence-sharded block computes a different output or gradient than
`impls.models.Block` (a shard of the wrong heads or hidden units, a gradient that the
all-gather / reduce-scatter pair fails to sum, a replicated LayerNorm gradient left
partial, padding that leaks into real positions), or that it moves a different number of
bytes or rounds than the all-gather / reduce-scatter count of `analytic.layer_traffic`.
"""

from __future__ import annotations

import pytest

from tests.sequence_parallel.sp_ranks import Case, run_cases

# Even lengths for P = 1, 2, 4 and lengths P does not divide (end-padded); the column
# layers keeping the gathered input, and keeping their shard only (`regather`).
CASES = [
    Case("megatron_sp", sp, seq_len, regather)
    for sp, seq_len in [(1, 8), (2, 8), (2, 7), (4, 8), (4, 12), (4, 10), (4, 3)]
    for regather in (False, True)
]


@pytest.mark.timeout(120)
def test_equal_full_block_and_analytic_traffic(ranks8):
    errors = [e for rank_errors in ranks8.run(run_cases, CASES) for e in rank_errors or []]
    assert errors == []
