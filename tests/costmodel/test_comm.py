"""The α–β collective times against hand counts.

A failure means a collective's round or byte count no longer matches what
`impls.collectives` sends (ring 2(N−1) rounds of M/N, recursive halving's fold, the
binomial tree, the parameter server's port), or that `collective_seconds` picks the wrong
link or misses the hierarchical all-reduce, or that `best_allreduce` stopped choosing as
MPICH does (logarithmic for small messages, ring for large ones).
"""

from __future__ import annotations

import pytest

from impls.costmodel.comm import (
    ALLREDUCE_ALGORITHMS,
    all_gather_seconds,
    all_to_all_seconds,
    allreduce_rounds,
    allreduce_seconds,
    best_allreduce,
    collective_seconds,
    hierarchical_allreduce_seconds,
    p2p_seconds,
    reduce_scatter_seconds,
    spanning_link,
)
from impls.costmodel.hardware import Hardware, Link

A, BW = 1e-3, 1e9  # 1 ms per message, 1 GB/s: seconds = messages·1e-3 + bytes·1e-9
LINK = Link(name="test", alpha_s=A, bandwidth=BW)


def _hw(per_node: int = 4) -> Hardware:
    return Hardware(
        name="test",
        devices_per_node=per_node,
        peak_flops={"bf16": 1e12},
        memory_bytes=1e9,
        memory_bandwidth=1e9,
        intra=Link(name="intra", alpha_s=1e-6, bandwidth=1e11),
        inter=Link(name="inter", alpha_s=1e-5, bandwidth=1e10),
        gemm_efficiency=((1.0, 1.0),),
    )


# (algorithm, n, messages, bytes) for M = 1200 bytes, worked by hand.
HAND = [
    ("ring", 4, 6, 1800),  # 2·3 rounds of 300
    ("ring", 3, 4, 1600),  # 2·2 rounds of 400
    ("recursive_halving", 4, 4, 1800),  # halves 600 + 300, then back
    ("recursive_halving", 8, 6, 2100),  # 600 + 300 + 150, twice
    ("recursive_halving", 6, 6, 1800 + 2400),  # p = 4, plus the fold's 2 × 1200
    ("tree", 4, 4, 4800),  # 2 rounds up, 2 down, whole buffer each
    ("tree", 5, 6, 7200),  # ⌈log2 5⌉ = 3
    ("parameter_server", 4, 6, 7200),  # server: 3 in, 3 out
    ("sequential", 4, 6, 7200),
    ("parallel", 4, 3, 3600),  # 3 whole buffers out
]


@pytest.mark.parametrize(("algorithm", "n", "messages", "nbytes"), HAND)
def test_allreduce_matches_hand_count(algorithm, n, messages, nbytes):
    expected = messages * A + nbytes / BW
    assert allreduce_seconds(1200, n, LINK, algorithm) == pytest.approx(expected)
    assert allreduce_rounds(n, algorithm) == messages  # the rounds a caller spreads work on


def test_halves_and_all_to_all_and_p2p():
    assert reduce_scatter_seconds(1200, 4, LINK) == pytest.approx(3 * A + 900 / BW)
    assert all_gather_seconds(1200, 4, LINK) == pytest.approx(3 * A + 900 / BW)
    assert all_to_all_seconds(1200, 3, LINK) == pytest.approx(2 * A + 800 / BW)
    assert p2p_seconds(1200, LINK) == pytest.approx(A + 1200 / BW)
    assert p2p_seconds(0, LINK) == 0.0


def test_efficiency_slows_the_bytes_only():
    half = Link(name="half", alpha_s=A, bandwidth=BW, efficiency=0.5)
    assert allreduce_seconds(1200, 4, half) == pytest.approx(6 * A + 3600 / BW)


@pytest.mark.parametrize("algorithm", ALLREDUCE_ALGORITHMS)
def test_one_rank_or_no_bytes_costs_nothing(algorithm):
    assert allreduce_seconds(1e9, 1, LINK, algorithm) == 0.0
    assert allreduce_seconds(0, 8, LINK, algorithm) == 0.0


def test_hierarchical_by_hand():
    intra = Link(name="intra", alpha_s=0.0, bandwidth=100.0)
    inter = Link(name="inter", alpha_s=0.0, bandwidth=10.0)
    # 8 ranks, 4 per node, M = 800: RS intra 3/4·800 at 100, AR of 200 over 2 nodes
    # (2·1/2·200 at 10), AG intra 3/4·800 at 100.
    expected = 6 + 20 + 6
    assert hierarchical_allreduce_seconds(800, 8, 4, intra, inter) == pytest.approx(expected)
    assert hierarchical_allreduce_seconds(800, 4, 4, intra, inter) == pytest.approx(12)
    assert hierarchical_allreduce_seconds(800, 4, 1, intra, inter) == pytest.approx(120)
    with pytest.raises(ValueError, match="per_node=3: must divide n=8"):
        hierarchical_allreduce_seconds(800, 8, 3, intra, inter)


def test_collective_seconds_picks_the_link():
    hw = _hw(per_node=4)
    assert collective_seconds("all_reduce", 1e6, 1, hw) == 0.0
    assert collective_seconds("all_gather", 1e6, 4, hw) == pytest.approx(
        all_gather_seconds(1e6, 4, hw.intra)
    )
    # 8 ranks over 2 nodes, 4 to a node: the ring crosses each node through its 4 NICs
    four_nics = spanning_link(hw, 4)
    assert four_nics.effective_bandwidth == pytest.approx(
        min(4 * hw.inter.effective_bandwidth, hw.intra.effective_bandwidth)
    )
    assert collective_seconds("reduce_scatter", 1e6, 8, hw) == pytest.approx(
        reduce_scatter_seconds(1e6, 8, four_nics)
    )
    # one member per node (stride 4): one NIC each; an all-to-all never shares NICs
    assert collective_seconds("all_gather", 1e6, 2, hw, stride=4) == pytest.approx(
        all_gather_seconds(1e6, 2, hw.inter)
    )
    assert collective_seconds("all_to_all", 1e6, 8, hw) == pytest.approx(
        all_to_all_seconds(1e6, 8, hw.inter)
    )
    # 2 ranks 4 apart sit on two nodes: the inter link, one member per node (flat)
    assert collective_seconds("all_reduce", 1e6, 2, hw, stride=4) == pytest.approx(
        allreduce_seconds(1e6, 2, hw.inter)
    )
    assert collective_seconds("p2p", 1e6, 2, hw, stride=4) == pytest.approx(
        p2p_seconds(1e6, hw.inter)
    )
    # 8 ranks over 2 nodes: hierarchical
    assert collective_seconds("all_reduce", 1e6, 8, hw) == pytest.approx(
        hierarchical_allreduce_seconds(1e6, 8, 4, hw.intra, hw.inter)
    )
    # 8 ranks 2 apart: 2 to a node over 4 nodes
    assert collective_seconds("all_reduce", 1e6, 8, hw, stride=2) == pytest.approx(
        hierarchical_allreduce_seconds(1e6, 8, 2, hw.intra, hw.inter)
    )
    # the lecture's algorithms run flat on the group's link
    assert collective_seconds("all_reduce", 1e6, 8, hw, algorithm="tree") == pytest.approx(
        allreduce_seconds(1e6, 8, hw.inter, "tree")
    )


def test_best_allreduce_small_and_large():
    slow = Link(name="ethernet", alpha_s=50e-6, bandwidth=1e9)
    name, seconds = best_allreduce(8, 12, slow)
    assert name == "recursive_halving"  # p = 8: 6 + 2 rounds, 2·7/8·8 + 2·8 bytes
    assert seconds == pytest.approx(8 * 50e-6 + 30 / 1e9)  # tree: 8 rounds, 64 bytes
    name, seconds = best_allreduce(1e9, 12, slow)
    assert name == "ring"
    assert seconds == pytest.approx(allreduce_seconds(1e9, 12, slow, "ring"))


@pytest.mark.parametrize(
    ("call", "message"),
    [
        (lambda: allreduce_seconds(1, 4, LINK, "butterfly"), "algorithm='butterfly': unknown"),
        (lambda: allreduce_seconds(-1, 4, LINK), "nbytes=-1"),
        (lambda: allreduce_seconds(1, 0, LINK), "n=0"),
        (lambda: collective_seconds("broadcast", 1, 2, _hw()), "kind='broadcast': unknown"),
        (lambda: collective_seconds("p2p", 1, 2, _hw(), stride=0), "stride=0"),
    ],
)
def test_refusals_name_the_key(call, message):
    with pytest.raises(ValueError, match=message):
        call()
