"""The screening bounds never exceed what the simulator predicts.

A failure here means the search could drop a plan that would have won (a time bound above
the simulated step, a memory bound above the simulated peak), or that the in-flight
counts disagree with the schedules themselves.
"""

from __future__ import annotations

import random
from dataclasses import replace

import pytest

from impls.pipeline.replay import max_inflight_microbatches
from impls.pipeline.schedules import build_plan
from impls.pipeline.theory import zero_bubble_max_inflight
from impls.planner.bounds import (
    inflight,
    layer_table,
    memory_bound,
    memory_bound_any_cut,
    time_bound,
    time_bound_any_cut,
)
from impls.planner.space import plan_space
from impls.simulator import simulate, stage_slices
from tests.planner import GPT8, small_cluster

HW = small_cluster()


@pytest.mark.parametrize(
    "schedule",
    ["gpipe", "1f1b", "zero_bubble_h1", "interleaved_1f1b", "zero_bubble_h2", "zero_bubble_v"],
)
@pytest.mark.parametrize("pp", [2, 3, 4])
@pytest.mark.parametrize("microbatches", [1, 2, 3, 4, 8, 12])
def test_inflight_matches_the_schedules(schedule, pp, microbatches):
    chunks = {"interleaved_1f1b": [2, 3], "zero_bubble_v": [2]}.get(schedule, [1])
    if schedule in ("zero_bubble_h2", "zero_bubble_v") and microbatches < pp:
        with pytest.raises(ValueError, match="microbatches"):
            inflight(schedule, pp, microbatches, chunks[0])
        return
    if schedule in ("zero_bubble_h2", "zero_bubble_v"):  # never above the paper's peak
        peak = zero_bubble_max_inflight(schedule, pp, microbatches)
        assert max(inflight(schedule, pp, microbatches, chunks[0])) == peak
    for v in chunks:
        if schedule == "interleaved_1f1b" and microbatches % pp:
            continue
        counts = max_inflight_microbatches(build_plan(schedule, pp, microbatches, v))
        assert inflight(schedule, pp, microbatches, v) == [counts[r] for r in range(pp)]


def sample_plans(count=250, seed=0):
    plans = plan_space(GPT8, HW, gpus=8, global_batch=16)
    return random.Random(seed).sample(plans, count)


@pytest.mark.parametrize("plan", sample_plans(), ids=str)
def test_bounds_hold_for_equal_slicing(plan):
    table = layer_table(GPT8, plan, HW, "bf16")
    ranges = stage_slices(GPT8.n_layers, plan)
    predicted = simulate(GPT8, plan, HW)
    assert time_bound(plan, table, ranges) <= predicted.step_time_s * (1 + 1e-12)
    memory = memory_bound(GPT8, plan, table, "bf16", ranges)
    if plan.virtual_stages == 1:
        assert memory == pytest.approx(predicted.peak_memory_bytes, rel=1e-12)
    else:
        assert memory <= predicted.peak_memory_bytes * (1 + 1e-12)
    assert memory_bound_any_cut(plan, table, "bf16") <= predicted.peak_memory_bytes * (1 + 1e-12)
    assert time_bound_any_cut(plan, table) <= time_bound(plan, table, ranges) * (1 + 1e-12)


@pytest.mark.parametrize("seed", range(30))
def test_any_cut_bound_holds_for_random_cuts(seed):
    rng = random.Random(seed)
    plans = [
        p
        for p in plan_space(GPT8, HW, gpus=8, global_batch=16)
        if p.pp > 1 and p.virtual_stages == 1
    ]
    plan = rng.choice(plans)
    bounds = sorted(rng.sample(range(1, GPT8.n_layers + 2), plan.pp - 1))
    edges = [0, *bounds, GPT8.n_layers + 2]
    cut = replace(plan, stage_layers=tuple(b - a for a, b in zip(edges, edges[1:], strict=False)))
    table = layer_table(GPT8, plan, HW, "bf16")
    predicted = simulate(GPT8, cut, HW)
    assert time_bound_any_cut(plan, table) <= predicted.step_time_s * (1 + 1e-12)
    assert time_bound(cut, table, stage_slices(GPT8.n_layers, cut)) <= predicted.step_time_s * (
        1 + 1e-12
    )
    assert memory_bound_any_cut(plan, table, "bf16") <= predicted.peak_memory_bytes * (1 + 1e-12)


def test_time_bound_is_one_f_one_b_by_hand():
    """Equal stages, free transfers: (M + P − 1)(F + B) is what the bound gives."""
    plan = next(
        p
        for p in plan_space(GPT8, HW, gpus=8, global_batch=16)
        if (p.tp, p.pp, p.schedule, p.microbatch_size) == (1, 2, "1f1b", 2)
    )
    table = layer_table(GPT8, plan, HW, "bf16")
    cut = replace(plan, stage_layers=(5, 5))
    ranges = stage_slices(GPT8.n_layers, cut)
    f0, b0 = table.work(0, 5)
    f1, b1 = table.work(5, 10)
    m = plan.num_microbatches
    assert time_bound(cut, table, ranges) == pytest.approx(
        max(m * (f0 + b0), f0 + m * (f1 + b1) + b0)
    )
