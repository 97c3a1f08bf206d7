"""The simulator's pipeline against the papers' utilization bounds.

With equal stages (F, I, W given per stage through `stage_costs`) and free communication the
replayed step must meet `impls.pipeline.theory` exactly. A failure means the simulator
builds or replays a schedule differently from the one the theory describes, so every
bubble it predicts at scale would be wrong too.
"""

from __future__ import annotations

import pytest

from impls.costmodel.compute import TransformerSpec
from impls.costmodel.hardware import Link
from impls.pipeline import utilization_bound
from impls.simulator import ParallelPlan, simulate
from tests.simulator import flat_hardware

CASES = [
    ("gpipe", 1, (2, 4, 8), (1, 4, 8)),
    ("1f1b", 1, (2, 4, 8), (1, 4, 8, 16)),
    ("interleaved_1f1b", 2, (2, 4), (4, 8, 16)),
    ("zero_bubble_h1", 1, (2, 4, 8), (8, 16)),
    ("zero_bubble_h2", 1, (2, 4, 8), (8, 16)),
]


def _utilization(schedule: str, pp: int, m: int, v: int) -> float:
    spec = TransformerSpec(
        n_layers=pp * v * 2 - 2, d_model=64, n_heads=4, vocab_size=128, seq_len=16
    )
    plan = ParallelPlan(
        dp=1,
        tp=1,
        pp=pp,
        num_microbatches=m,
        schedule=schedule,
        virtual_stages=v,
        stage_layers=(2,) * (pp * v),
    )
    # T_F = T_I = T_W = 1 per stage: B = I + W = 2F, as GPipe/1F1B/interleaved assume.
    pred = simulate(spec, plan, flat_hardware(), stage_costs=[(1.0, 1.0, 1.0)] * plan.stages)
    assert pred.exposed_tp_s == 0
    busy = pred.compute_s
    return busy / (busy + pred.bubble_s + pred.exposed_pp_s)


@pytest.mark.parametrize(("schedule", "v", "stages", "microbatches"), CASES)
def test_utilization_equals_theory(schedule, v, stages, microbatches):
    for pp in stages:
        for m in microbatches:
            if schedule == "interleaved_1f1b" and m % pp:
                continue
            if schedule == "zero_bubble_h1" and m < pp:
                continue
            if schedule == "zero_bubble_h2" and m < 2 * pp - 1:
                continue
            expected = utilization_bound(schedule, pp, m, v)
            assert _utilization(schedule, pp, m, v) == pytest.approx(expected, rel=1e-9), (
                schedule,
                pp,
                m,
            )


def test_priced_transfers_only_add_time():
    """A slow link between pipeline ranks shows up as exposed_pp_s, nowhere else."""
    spec = TransformerSpec(n_layers=6, d_model=64, n_heads=4, vocab_size=128, seq_len=16)
    plan = ParallelPlan(dp=1, tp=1, pp=4, num_microbatches=8)
    costs = [(1.0, 1.0, 1.0)] * 4
    free = simulate(spec, plan, flat_hardware(), stage_costs=costs)
    slow = simulate(spec, plan, flat_hardware(alpha_s=0.1), stage_costs=costs)
    assert free.exposed_pp_s == pytest.approx(0.0, abs=1e-12)
    assert slow.exposed_pp_s > 0.3 - 1e-9  # at least the fill: 3 sends of 0.1 s
    assert slow.bubble_s == pytest.approx(free.bubble_s)
    assert slow.compute_s == free.compute_s


def test_pipeline_neighbours_on_other_nodes_use_the_inter_node_link():
    """Layout tp innermost, then dp, then pp: with tp·dp = 8 devices per pipeline rank, a node
    of 8 puts every pipeline rank on its own node; a node of 16 holds two of them."""
    spec = TransformerSpec(n_layers=2, d_model=64, n_heads=4, vocab_size=128, seq_len=16)
    plan = ParallelPlan(dp=4, tp=2, pp=2, num_microbatches=1)
    costs = [(1.0, 1.0, 1.0)] * 2
    base = flat_hardware()
    results = {}
    for per_node in (8, 16):
        hw = type(base)(
            **{
                **base.__dict__,
                "devices_per_node": per_node,
                "inter": Link(name="slow", alpha_s=1.0, bandwidth=1e30),
            }
        )
        results[per_node] = simulate(spec, plan, hw, stage_costs=costs).exposed_pp_s
    assert results[8] == pytest.approx(2.0)  # one activation forward, one gradient back
    assert results[16] == pytest.approx(0.0, abs=1e-12)
