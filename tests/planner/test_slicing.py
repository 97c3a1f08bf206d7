"""Alpa's stage slicing against brute force over every cut.

A failure means `alpa_stage_slicing` returns a cut whose Eq. 2 value (Σ tᵢ + (B − 1) max tᵢ)
is worse than the best cut that fits, accepts a cut over the memory limit, or misses that
nothing fits.
"""

from __future__ import annotations

import random
from itertools import combinations

import pytest

from impls.planner.slicing import alpa_chain_slicing, alpa_stage_slicing, pipeline_objective


def compositions(layers: int, stages: int):
    for bounds in combinations(range(1, layers), stages - 1):
        edges = (0, *bounds, layers)
        yield tuple(b - a for a, b in zip(edges, edges[1:], strict=False))


def stage_ranges(counts):
    start = 0
    for count in counts:
        yield start, start + count - 1
        start += count


def brute_force(seconds, stage_bytes, stages, microbatches, limit):
    best = None
    for cut in compositions(len(seconds), stages):
        if any(stage_bytes(a, b, s) > limit for s, (a, b) in enumerate(stage_ranges(cut))):
            continue
        value = pipeline_objective(seconds, cut, microbatches)
        if best is None or value < best:
            best = value
    return best


@pytest.mark.parametrize("seed", range(40))
def test_matches_brute_force(seed):
    rng = random.Random(seed)
    layers, stages = rng.randint(6, 10), rng.randint(2, 4)
    microbatches = rng.choice([1, 2, 4, 8, 32])
    seconds = [rng.uniform(0.1, 3.0) for _ in range(layers)]
    weights = [rng.uniform(1.0, 4.0) for _ in range(layers)]

    def stage_bytes(first, last, stage):  # 1F1B-like: stage s holds (stages − s) in flight
        return (stages - stage) * sum(weights[first : last + 1])

    limit = None if seed % 3 == 0 else rng.uniform(0.4, 1.2) * sum(weights) * 2
    cut = alpa_stage_slicing(seconds, stage_bytes, stages, microbatches, limit)
    expected = brute_force(
        seconds, stage_bytes, stages, microbatches, float("inf") if limit is None else limit
    )
    if expected is None:
        assert cut is None
        return
    assert cut is not None and sum(cut) == layers and len(cut) == stages
    for s, (a, b) in enumerate(stage_ranges(cut)):
        assert limit is None or stage_bytes(a, b, s) <= limit
    assert pipeline_objective(seconds, cut, microbatches) == pytest.approx(expected, rel=1e-12)


def test_per_layer_bytes_sequence_is_summed():
    # 4 equal layers, 2 stages; with bytes (5, 1, 1, 1) and a limit of 5 the first stage can
    # only hold layer 0, although (2, 2) would balance the time
    cut = alpa_stage_slicing([1.0] * 4, [5.0, 1.0, 1.0, 1.0], 2, 4, memory_limit=5.0)
    assert cut == (1, 3)
    assert alpa_stage_slicing([1.0] * 4, [5.0, 1.0, 1.0, 1.0], 2, 4) == (2, 2)


def test_nothing_fits_returns_none():
    assert alpa_stage_slicing([1.0] * 4, [3.0] * 4, 2, 4, memory_limit=5.0) is None


@pytest.mark.parametrize(("layers", "stages"), [(8, 4), (12, 3), (16, 8), (130, 65)])
def test_equal_costs_give_equal_stages(layers, stages):
    assert alpa_stage_slicing([2.5] * layers, [1.0] * layers, stages, 16) == (
        (layers // stages,) * stages
    )


def test_heavy_head_gets_fewer_layers():
    # embedding (cheap), 8 layers of 1 s, an LM head of 3 s: the head's stage takes fewer
    seconds = [0.1] + [1.0] * 8 + [3.0]
    cut = alpa_stage_slicing(seconds, [0.0] * 10, 4, 16)
    # by hand: no cut gets every stage under 3 s (the head alone takes 3); with 3 s the
    # embedding and 2 layers (2.1 s), 3 layers, 3 layers and the head alone
    assert cut == (3, 3, 3, 1)
    assert pipeline_objective(seconds, cut, 16) == pytest.approx(11.1 + 15 * 3.0)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"stages": 0}, "stages=0"),
        ({"stages": 5}, "stages=5: more stages than the 4 layers"),
        ({"microbatches": 0}, "microbatches=0"),
        ({"layer_bytes": [1.0]}, "layer_bytes: needs 4 entries"),
    ],
)
def test_refuses_malformed_arguments(kwargs, message):
    args = {
        "layer_seconds": [1.0] * 4,
        "layer_bytes": [1.0] * 4,
        "stages": 2,
        "microbatches": 2,
    } | kwargs
    with pytest.raises(ValueError, match=message):
        alpa_stage_slicing(**args)


@pytest.mark.parametrize("seed", range(40))
def test_chain_slicing_matches_the_dp(seed):
    """Embedding, identical body layers, head: the O(P log L) chain solver reaches the same
    Eq. 2 value and balance (Σ tᵢ²) as Algorithm 1's DP, memory limit included."""
    rng = random.Random(100 + seed)
    body_layers, stages = rng.randint(2, 12), rng.randint(2, 5)
    stages = min(stages, body_layers + 2)
    first, body, last = rng.uniform(0.0, 2.0), rng.uniform(0.5, 2.0), rng.uniform(0.0, 4.0)
    seconds = [first] + [body] * body_layers + [last]
    held = [stages - s for s in range(stages)]
    weight = [rng.uniform(0.5, 2.0)] + [1.0] * body_layers + [rng.uniform(0.5, 3.0)]
    limit = rng.uniform(0.3, 1.0) * stages * sum(weight) / 2 if seed % 4 else float("inf")

    def stage_bytes(a, b, s):
        return held[s] * sum(weight[a : b + 1])

    def fits(s, k):
        span = (
            (0, k)
            if s == 0
            else (body_layers + 1 - k, body_layers + 1)
            if s == stages - 1
            else (1, k)
        )
        return stage_bytes(*span, s) <= limit

    chain = alpa_chain_slicing(first, body, last, body_layers, stages, fits)
    dp = alpa_stage_slicing(seconds, stage_bytes, stages, 8, limit)
    assert (chain is None) == (dp is None)
    if dp is None:
        return
    assert sum(chain) == body_layers + 2
    for s, (a, b) in enumerate(stage_ranges(chain)):
        assert stage_bytes(a, b, s) <= limit
    assert pipeline_objective(seconds, chain, 8) == pytest.approx(
        pipeline_objective(seconds, dp, 8), rel=1e-9
    )

    def squares(cut):
        return sum(sum(seconds[a : b + 1]) ** 2 for a, b in stage_ranges(cut))

    assert squares(chain) == pytest.approx(squares(dp), rel=1e-9)
