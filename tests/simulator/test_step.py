"""A whole step: a tiny plan priced by hand, the breakdown adding up, sanity at scale.

A failure in the hand-computed step means the simulator composes its parts (layers,
accumulation, the DP all-reduce, the optimizer) differently from what it documents; in the
others, that a prediction moved the wrong way or left its plausible range.
"""

from __future__ import annotations

import pytest

from impls.costmodel.comm import collective_seconds
from impls.costmodel.compute import TransformerSpec
from impls.simulator import ParallelPlan, simulate
from tests.simulator import GPT3, TINY, a100_like, flat_hardware

H, F, V, T = 64, 256, 128, 16  # TINY with micro-batch 1


def _parts(pred) -> float:
    return (
        pred.compute_s
        + pred.bubble_s
        + pred.exposed_tp_s
        + pred.exposed_pp_s
        + pred.exposed_dp_s
        + pred.optimizer_s
    )


def test_tiny_data_parallel_step_by_hand():
    hw = flat_hardware(alpha_s=1e-3, bandwidth=1e9)
    plan = ParallelPlan(dp=2, tp=1, pp=1, num_microbatches=2)
    pred = simulate(TINY, plan, hw)

    def gemm(flops):
        return flops / (1e14 * 0.5)

    def moved(nbytes):
        return nbytes / 1e12

    weights = 2 * T * H * 3 * H + 2 * T * H * H + 2 * 2 * T * H * F
    core = 4 * T * T * H
    scores = 4 * T * T
    elementwise = 2 * (10 * T * H + 2 * T * F + 2 * scores) + 5 * (2 * T * H + scores)
    layer = gemm(3 * weights + 3 * core) + moved(3 * elementwise)  # F + I + W
    embedding = moved(9 * T * H) + moved(11 * T * H)  # lookup + dropout; scatter-add
    head = gemm(3 * 2 * T * H * V) + moved(12 * T * H) + moved(16 * T * V)
    compute = 2 * (2 * layer + embedding + head)  # 2 micro-batches, accumulated
    params = 2 * V * H + 2 * (4 * H * H + 2 * H * F + 4 * H) + 2 * H
    # All 2Ψ bytes of bf16 gradients fit one 25 MB bucket: nothing of it hides.
    all_reduce = collective_seconds("all_reduce", 2 * params, 2, hw, stride=1)
    adam = moved(28 * params)  # 2·12 + 2 + 2 bytes per parameter
    assert pred.compute_s == pytest.approx(compute, rel=1e-12)
    assert pred.exposed_dp_s == pytest.approx(all_reduce, rel=1e-12)
    assert pred.optimizer_s == pytest.approx(adam, rel=1e-9)
    assert pred.step_time_s == pytest.approx(compute + all_reduce + adam, rel=1e-12)
    assert pred.bubble_s == pred.exposed_pp_s == pred.exposed_tp_s == 0
    assert pred.tokens_per_s == pytest.approx(2 * 2 * T / pred.step_time_s)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble_h1"])
@pytest.mark.parametrize("zero_stage", [0, 1, 2, 3])
def test_breakdown_adds_up_to_the_step(schedule, zero_stage):
    spec = TransformerSpec(n_layers=14, d_model=1024, n_heads=16, vocab_size=32000, seq_len=512)
    plan = ParallelPlan(
        dp=4,
        tp=2,
        pp=4,
        sp="megatron_sp",
        zero_stage=zero_stage,
        num_microbatches=8,
        schedule=schedule,
        virtual_stages=2 if schedule == "interleaved_1f1b" else 1,
    )
    pred = simulate(spec, plan, a100_like())
    assert _parts(pred) == pytest.approx(pred.step_time_s, rel=1e-12)
    assert min(pred.bubble_s, pred.exposed_tp_s, pred.exposed_pp_s, pred.exposed_dp_s) > 0


def test_more_data_parallel_gpus_lower_the_compute_per_step():
    spec = TransformerSpec(n_layers=8, d_model=1024, n_heads=16, vocab_size=32000, seq_len=512)
    computes = [
        simulate(
            spec, ParallelPlan(dp=dp, tp=1, pp=1, num_microbatches=16 // dp), a100_like()
        ).compute_s
        for dp in (1, 2, 4, 8)
    ]
    assert computes == sorted(computes, reverse=True)
    assert computes[0] == pytest.approx(8 * computes[-1])


def test_zero_bubble_beats_1f1b_on_priced_stages():
    plans = {
        s: ParallelPlan(dp=1, tp=8, pp=8, num_microbatches=16, schedule=s)
        for s in ("1f1b", "zero_bubble_h1")
    }
    spec = TransformerSpec(n_layers=30, d_model=4096, n_heads=32, vocab_size=32000, seq_len=2048)
    one, zb = (simulate(spec, plans[s], a100_like()) for s in ("1f1b", "zero_bubble_h1"))
    assert zb.bubble_s < one.bubble_s
    assert zb.compute_s == pytest.approx(one.compute_s)


def test_gpt3_175b_smoke():
    """Sanity band, not a target: Megatron-LM reports ~0.5 MFU-class figures for this layout
    (Narayanan et al. 2021, Table 1); a prediction outside 0.2–0.7 means a unit went wrong."""
    plan = ParallelPlan(
        dp=8, tp=8, pp=16, num_microbatches=64, sp="megatron_sp", recompute="selective"
    )
    pred = simulate(GPT3, plan, a100_like())
    assert 0.2 < pred.mfu < 0.7
    assert pred.hfu >= pred.mfu
    assert _parts(pred) == pytest.approx(pred.step_time_s, rel=1e-12)
    assert pred.tflops_per_gpu == pytest.approx(pred.mfu * 312)
    assert len(pred.stage_times) == 16


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble_h1"])
def test_blocking_sends_hold_the_sender_as_the_reference_replay_places_them(schedule):
    """On `p2p_blocking` hardware a send is time its sending action holds the rank for (F
    sends forward, I or B backward), and the receiver has it when that action ends: the
    step is `impls.pipeline.replay` with those longer actions and free transfers, the
    breakdown still adds up, and blocking is never sooner than latency-only sends."""
    from dataclasses import replace

    from impls.costmodel.comm import p2p_seconds
    from impls.pipeline import replay
    from impls.pipeline.schedules import build_plan

    spec = TransformerSpec(n_layers=8, d_model=256, n_heads=8, vocab_size=512, seq_len=128)
    v = 2 if schedule == "interleaved_1f1b" else 1
    plan = ParallelPlan(
        dp=1, tp=1, pp=2, num_microbatches=4, schedule=schedule, virtual_stages=v, microbatch_size=2
    )
    costs = [(1e-3 * (s + 1), 2e-3, 1e-3) for s in range(2 * v)]  # (F, I, W) per stage
    hw = flat_hardware(alpha_s=4e-4, bandwidth=1e9)
    latency = simulate(spec, plan, hw, stage_costs=costs)
    blocking = simulate(spec, plan, replace(hw, p2p_blocking=True), stage_costs=costs)
    send = p2p_seconds(2 * 128 * 256 * 2, hw.inter)  # micro-batch × s × h × bf16 bytes

    def held(action) -> float:
        f, i, w = costs[action.stage]
        first, last = action.stage == 0, action.stage == 2 * v - 1
        return {
            "F": f + (0 if last else send),
            "I": i + (0 if first else send),
            "W": w,
            "B": i + w + (0 if first else send),
        }[action.kind]

    reference = replay(build_plan(schedule, 2, 4, v), held, 0.0, 2 * v)
    pipeline_end = blocking.step_time_s - blocking.optimizer_s - blocking.exposed_dp_s
    assert pipeline_end == pytest.approx(reference.makespan, rel=1e-12)
    assert _parts(blocking) == pytest.approx(blocking.step_time_s, rel=1e-12)
    assert blocking.step_time_s >= latency.step_time_s
    assert blocking.compute_s == latency.compute_s and blocking.bubble_s == latency.bubble_s


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b", "interleaved_1f1b", "zero_bubble_h1"])
def test_action_overhead_lengthens_every_compute_action_once(schedule):
    """`Hardware.action_overhead_s` is paid once by each F and each backward action (I and
    W apart when split): with free sends the step is `impls.pipeline.replay` of actions
    that long, the breakdown adds up, and the rank's compute grows by one overhead per
    action it runs."""
    from dataclasses import replace

    from impls.pipeline import replay
    from impls.pipeline.schedules import build_plan

    spec = TransformerSpec(n_layers=8, d_model=256, n_heads=8, vocab_size=512, seq_len=128)
    v = 2 if schedule == "interleaved_1f1b" else 1
    plan = ParallelPlan(
        dp=1, tp=1, pp=2, num_microbatches=4, schedule=schedule, virtual_stages=v, microbatch_size=2
    )
    costs = [(1e-3 * (s + 1), 2e-3, 1e-3) for s in range(2 * v)]  # (F, I, W) per stage
    hw = replace(flat_hardware(alpha_s=4e-4, bandwidth=1e9), p2p_blocking=True)
    extra = 3e-4
    plain = simulate(spec, plan, hw, stage_costs=costs)
    loaded = simulate(spec, plan, replace(hw, action_overhead_s=extra), stage_costs=costs)
    split = schedule == "zero_bubble_h1"
    per_microbatch = (3 if split else 2) * v  # actions of one micro-batch on one rank
    assert loaded.compute_s - plain.compute_s == pytest.approx(4 * per_microbatch * extra)
    assert _parts(loaded) == pytest.approx(loaded.step_time_s, rel=1e-12)

    def held(action) -> float:
        f, i, w = costs[action.stage]
        return {"F": f, "I": i, "W": w, "B": i + w}[action.kind] + extra

    free = replay(build_plan(schedule, 2, 4, v), held, 0.0, 2 * v)
    no_send = simulate(
        spec, plan, replace(flat_hardware(), action_overhead_s=extra), stage_costs=costs
    )
    pipeline_end = no_send.step_time_s - no_send.optimizer_s - no_send.exposed_dp_s
    assert pipeline_end == pytest.approx(free.makespan, rel=1e-12)
