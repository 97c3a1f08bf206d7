"""Context parallelism (`ParallelPlan.cp`, ring attention): the plan's rules, per-rank work,
memory and ring traffic, and the data-parallel group.

A failure means a cp rank is priced on the wrong number of tokens, its activations are not
split, the ring's K/V traffic is hidden where no attention compute covers it (or charged
where it is covered), the gradient group leaves out the cp ranks that hold the same
weights, or a plan the sequence cannot be cut by is accepted.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from impls.costmodel.comm import p2p_seconds
from impls.costmodel.compute import TransformerSpec
from impls.simulator import ParallelPlan, simulate
from impls.simulator.costs import transformer_price
from impls.simulator.step import _transfers
from impls.simulator.zero_comm import dp_group
from tests.simulator import TINY, flat_hardware

B = 2


def test_cp_is_a_counted_axis_of_the_grid():
    plan = ParallelPlan(dp=2, cp=4, tp=2, pp=3)
    assert plan.gpus == 2 * 4 * 2 * 3
    with pytest.raises(ValueError, match="cp=0"):
        ParallelPlan(dp=1, tp=1, pp=1, cp=0)


@pytest.mark.parametrize(
    ("changes", "key"),
    [
        ({"cp": 3}, "cp=3: .*must divide seq_len=16"),
        ({"cp": 8, "tp": 4, "sp": "megatron_sp"}, "tp=4: .*divide seq_len/cp=2"),
    ],
)
def test_cp_must_cut_the_sequence(changes, key):
    with pytest.raises(ValueError, match=key):
        simulate(TINY, ParallelPlan(**{"dp": 1, "tp": 1, "pp": 1, **changes}), flat_hardware())


def test_cp_rank_does_the_layer_on_its_share_of_the_tokens():
    """On flat hardware (one GEMM efficiency, no overheads, free links) every term of a cp
    rank's layer is 1/cp of the whole: weight GEMMs and token-wise bytes on T/cp tokens,
    the core on s/cp queries against all s keys."""
    hw = flat_hardware()
    for spec in (TINY, replace(TINY, attention="flash")):
        one = transformer_price(spec, B, 1, "none", "none", hw, "bf16")
        two = transformer_price(spec, B, 1, "none", "none", hw, "bf16", cp=2)
        assert two.forward_s == pytest.approx(one.forward_s / 2)
        assert two.input_s == pytest.approx(one.input_s / 2)
        assert two.weight_s == pytest.approx(one.weight_s / 2)
        assert two.params == one.params  # every cp rank holds the whole layer
        assert two.tp_forward_s == 0  # free links: nothing exposed
        assert two.tp_backward_s == pytest.approx(0, abs=1e-20)  # but the last hop home


def test_cp_halves_the_activations_a_rank_holds():
    spec = TransformerSpec(
        n_layers=4, d_model=64, n_heads=4, vocab_size=128, seq_len=64, attention="flash"
    )
    hw = flat_hardware()
    one = simulate(spec, ParallelPlan(dp=2, tp=1, pp=1, num_microbatches=2), hw)
    two = simulate(spec, ParallelPlan(dp=1, cp=2, tp=1, pp=1, num_microbatches=2), hw)
    held = one.memory_breakdown["activations"]
    assert two.memory_breakdown["activations"] == pytest.approx(held / 2)
    assert two.memory_breakdown["weights"] == one.memory_breakdown["weights"]


def test_ring_traffic_is_exposed_only_where_the_step_compute_does_not_cover_it():
    """Forward: cp − 1 hops of a K and a V block (b · s/cp · h·k/a/t elements each), each
    beside one of the cp steps of the core; backward: K/V with dK/dV, plus dK/dV home."""
    slow = flat_hardware(bandwidth=1e6, alpha_s=1e-5)
    cp, tp = 4, 1
    price = transformer_price(TINY, B, tp, "none", "none", slow, "bf16", cp=cp)
    fast = transformer_price(TINY, B, tp, "none", "none", flat_hardware(), "bf16", cp=cp)
    block = B * TINY.seq_len / cp * TINY.d_model * 2  # bytes of one K (or V) block, bf16
    link = slow.intra
    core_f = 4 * B * TINY.n_heads * (TINY.seq_len / cp) * TINY.seq_len * 16 / (1e14 * 0.5)
    kv, kv_grads = p2p_seconds(2 * block, link), p2p_seconds(4 * block, link)
    assert kv > core_f / cp  # this link is too slow for the compute to hide a hop
    assert price.tp_forward_s == pytest.approx((cp - 1) * (kv - core_f / cp))
    core_b = 2 * core_f
    expected_b = (cp - 1) * (kv_grads - core_b / cp) + p2p_seconds(2 * block, link)
    assert price.tp_backward_s == pytest.approx(expected_b)
    assert fast.tp_forward_s == 0  # a free link is hidden entirely


def test_ring_crosses_nodes_only_when_the_cp_group_does():
    """The cp group is cp ranks tp apart (tp innermost): 2 · 4 = 8 fits a node of 8."""
    two_links = replace(
        flat_hardware(bandwidth=1e6, per_node=8), inter=flat_hardware(bandwidth=1e5).inter
    )
    inside = transformer_price(TINY, B, 4, "none", "none", two_links, "bf16", cp=2)
    across = transformer_price(TINY, B, 2, "none", "none", two_links, "bf16", cp=8)
    assert 0 < inside.tp_forward_s < across.tp_forward_s


def test_pipeline_sends_carry_the_ranks_tokens_only():
    hw = flat_hardware(bandwidth=1e9)
    plan = ParallelPlan(dp=1, tp=1, pp=2, num_microbatches=2)
    whole, _ = _transfers(plan, TINY, hw, "bf16")
    half, _ = _transfers(replace(plan, cp=2), TINY, hw, "bf16")
    assert half[0] == pytest.approx(whole[0] / 2)


def test_the_gradient_group_is_dp_times_cp():
    """Megatron-core reduces gradients over the data-parallel group with context
    parallelism: every rank of a (dp, cp) pair holds the same weights."""
    assert dp_group(ParallelPlan(dp=4, cp=2, tp=2, pp=1)) == (8, 2)
    assert dp_group(ParallelPlan(dp=4, cp=2, tp=2, pp=1, sp="ulysses")) == (16, 1)
    assert dp_group(ParallelPlan(dp=4, tp=2, pp=1)) == (4, 2)
    zero = simulate(TINY, ParallelPlan(dp=1, cp=2, tp=1, pp=1, zero_stage=1), flat_hardware())
    plain = simulate(TINY, ParallelPlan(dp=1, cp=2, tp=1, pp=1), flat_hardware())
    # ZeRO-1 shards the optimizer over dp·cp = 2 ranks although dp = 1
    assert zero.memory_breakdown["optimizer"] == pytest.approx(
        plain.memory_breakdown["optimizer"] / 2
    )
