"""Megatron tensor parallelism computes exactly the single-device GPT.

A failure here means a TP layer computes a different function or gradient than the layer
it was cut from (a shard taken from the wrong rows, a bias added t times, an `f` or `g`
missing or doubled, an out-of-range token not masked, a softmax normalised per shard),
that the traffic differs from Megatron's count of one all-reduce of b·s·h per attention
and per MLP each way, that the layers disagree with torch DTensor's `parallelize_module`,
or that a TP degree the model cannot be split by is accepted instead of refused by name.
"""

from __future__ import annotations

from types import SimpleNamespace

import pytest
from torch import nn

from impls.models import GPT, CausalSelfAttention, FeedForward, GPTConfig
from impls.tensor_parallel import (
    ColumnParallelLinear,
    ParallelFeedForward,
    ParallelSelfAttention,
    RowParallelLinear,
    VocabParallelEmbedding,
    analytic_comm,
    check_tp_config,
    parallelize_gpt,
)
from tests.tensor_parallel.tp_ranks import CHECKS, DEGREES, dtensor_mlp, run_checks


@pytest.fixture(scope="module")
def tp_results(ranks8) -> dict:
    """Every check for every degree in one pool call (starting work on ranks costs seconds)."""
    per_rank = ranks8.run(run_checks, list(CHECKS))
    return {rank: out for rank, out in enumerate(per_rank) if out is not None}


@pytest.mark.parametrize("t", DEGREES)
@pytest.mark.parametrize("check", list(CHECKS))
def test_equals_single_device(tp_results: dict, check: str, t: int) -> None:
    ranks = [rank for rank, out in tp_results.items() if (check, t) in out]
    assert ranks == list(range(t))
    errors = [f"rank {r}: {e}" for r in ranks for e in tp_results[r][(check, t)]]
    assert errors == []


def test_mlp_equals_dtensor_parallelize_module(ranks8) -> None:
    per_rank = ranks8.run(dtensor_mlp)
    for rank, out in enumerate(per_rank):
        if rank < 4:
            assert sorted(out) == ([2, 4] if rank < 2 else [4])
            assert [e for errs in out.values() for e in errs] == []
        else:
            assert out is None


def test_analytic_count_is_megatrons() -> None:
    # b·s·h = 2·4·16 floats = 512 B; ring: 2(t−1)/t of it per rank per all-reduce.
    mlp = analytic_comm(2, 4, 16, 4, layer="mlp")
    assert (mlp.allreduces_fwd, mlp.allreduces_bwd) == (1, 1)
    assert mlp.bytes_sent_fwd == mlp.bytes_sent_bwd == 2 * 3 * 512 // 4
    assert mlp.rounds_fwd == 6
    block = analytic_comm(2, 4, 16, 4)
    assert block.bytes_sent_fwd == 2 * mlp.bytes_sent_fwd
    assert analytic_comm(2, 4, 16, 1).bytes_sent_fwd == 0
    with pytest.raises(ValueError, match="layer='lm'.*attention, mlp, block"):
        analytic_comm(2, 4, 16, 2, layer="lm")


def _comm(t: int) -> SimpleNamespace:
    """Enough of a Communicator for the checks that run before any message."""
    return SimpleNamespace(world_size=t, rank=0)


def test_bad_degrees_are_refused_naming_the_key() -> None:
    cfg = GPTConfig(vocab_size=30, d_model=16, n_heads=4, d_ff=24, seq_len=8, n_layers=1)
    with pytest.raises(ValueError, match=r"GPTConfig.n_heads=4 .* tp=3; allowed tp: \[1, 2, 4\]"):
        check_tp_config(cfg, 3)
    with pytest.raises(ValueError, match=r"GPTConfig.d_ff=22 .* tp=4"):
        check_tp_config(GPTConfig(vocab_size=32, d_model=16, n_heads=4, d_ff=22), 4)
    with pytest.raises(ValueError, match=r"GPTConfig.vocab_size=30 .* tp=4"):
        check_tp_config(GPTConfig(vocab_size=30, d_model=16, n_heads=4), 4)
    with pytest.raises(ValueError, match="tp=0"):
        check_tp_config(cfg, 0)
    with pytest.raises(ValueError, match="n_heads=4"):
        parallelize_gpt(GPT(cfg), _comm(3))

    full = GPTConfig(d_model=12, n_heads=2, d_ff=20, vocab_size=10)
    with pytest.raises(ValueError, match="n_heads=2 .* tp=4"):
        ParallelSelfAttention.from_module(CausalSelfAttention(full), _comm(4))
    with pytest.raises(ValueError, match="d_ff=20 .* tp=3"):
        ParallelFeedForward.from_module(FeedForward(full), _comm(3))
    with pytest.raises(ValueError, match="vocab_size=10 .* tp=4"):
        VocabParallelEmbedding.from_module(nn.Embedding(10, 4), _comm(4))
    with pytest.raises(ValueError, match="out_features=6 .* tp=4"):
        ColumnParallelLinear.from_linear(nn.Linear(4, 6), _comm(4))
    with pytest.raises(ValueError, match="in_features=6 .* tp=4"):
        RowParallelLinear.from_linear(nn.Linear(6, 4), _comm(4))
