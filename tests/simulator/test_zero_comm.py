"""Data-parallel / ZeRO communication: which collectives, on which group, how much exposed.

A failure means the simulator charges a ZeRO stage the wrong collectives (ZeRO paper §7:
2Ψ for stages 0–2, 3Ψ for stage 3) or hides more of them behind compute than a bucketed
overlap can.
"""

from __future__ import annotations

from dataclasses import replace

import pytest

from impls.costmodel.comm import collective_seconds
from impls.simulator import ParallelPlan
from impls.simulator.zero_comm import bucketed, dp_group, end_of_step, exposed, per_action
from tests.simulator import flat_hardware

HW = flat_hardware(alpha_s=1e-4, bandwidth=1e10, per_node=4)
BIG = 400 * 2**20  # 400 MiB: 16 buckets


def _plan(**changes) -> ParallelPlan:
    return ParallelPlan(**{"dp": 4, "tp": 2, "pp": 1, **changes})


def _t(kind: str, nbytes: float, plan: ParallelPlan) -> float:
    size, stride = dp_group(plan)
    return collective_seconds(kind, nbytes, size, HW, stride=stride)


def test_groups_follow_the_layout():
    assert dp_group(_plan()) == (4, 2)  # dp ranks sit tp apart
    assert dp_group(_plan(sp="ulysses")) == (8, 1)  # Ulysses reduces over dp·tp


def test_buckets_hide_one_unit_of_compute_each_and_the_first_never():
    """DDP's 16 buckets of 400 MiB: the first bucket's all-reduce waits for the compute that
    fills it; each later one hides only under one bucket's share of the window."""
    plan = _plan()
    bucket = _t("all_reduce", BIG / 16, plan)
    assert bucketed("all_reduce", BIG, plan, HW, 0.0) == pytest.approx(16 * bucket)
    assert bucketed("all_reduce", BIG, plan, HW, 1e9) == pytest.approx(bucket)
    half = 16 * bucket / 2  # each bucket's compute is half its transfer
    assert bucketed("all_reduce", BIG, plan, HW, half) == pytest.approx(bucket + 15 * bucket / 2)
    small = _t("all_reduce", 1e6, plan)
    assert bucketed("all_reduce", 1e6, plan, HW, 1e9) == pytest.approx(small)
    assert bucketed("all_reduce", BIG, _plan(dp=1), HW, 0.0) == 0


def test_collectives_under_one_backward_share_the_link():
    """ZeRO-3's backward: each unit's gather and reduce-scatter queue on one link, so once
    the link is the bottleneck the exposure is their sum less the compute, not the larger."""
    plan, k = _plan(), 8
    gather, reduce = (("all_gather", BIG),), (("reduce_scatter", BIG),)
    t_g, t_rs = _t("all_gather", BIG / k, plan), _t("reduce_scatter", BIG / k, plan)
    unit = t_g + t_rs
    assert exposed(gather + reduce, plan, HW, 1e9, k) == pytest.approx(unit)  # first unit only
    assert exposed(gather + reduce, plan, HW, 0.0, k) == pytest.approx(k * unit)
    window = k * 1.5 * t_g  # each unit's compute outlasts either transfer, not both
    shared = exposed(gather + reduce, plan, HW, window, k)
    assert shared == pytest.approx(unit + (k - 1) * (unit - 1.5 * t_g))
    apart = exposed(gather, plan, HW, window, k) + exposed(reduce, plan, HW, window, k)
    assert apart == pytest.approx(unit) and shared > 2 * apart


@pytest.mark.parametrize(
    ("stage", "collectives"),
    [
        (0, [("all_reduce", 2)]),
        (1, [("reduce_scatter", 2), ("all_gather", 2)]),
        (2, [("all_gather", 2)]),
        (3, []),
    ],
)
def test_end_of_step(stage, collectives):
    plan = _plan(zero_stage=stage)
    params = BIG / 2  # BIG bytes at 2 bytes a parameter: 16 DDP buckets of 25 MiB each
    expected = sum(16 * _t(kind, params * per / 16, plan) for kind, per in collectives)
    assert end_of_step(plan, HW, params, 2, 2, 0.0, 0.0) == pytest.approx(expected)


def test_zero_2_and_3_communicate_every_microbatch():
    params = BIG / 2
    assert per_action(_plan(zero_stage=1), HW, params, 2, 2, 0, 0, 0, False).weight == 0
    two = per_action(_plan(zero_stage=2), HW, params, 2, 2, 0.0, 0.0, 0.0, False)
    assert (two.forward, two.input) == (0, 0)
    assert two.weight == pytest.approx(_t("reduce_scatter", BIG, _plan()))
    three = per_action(_plan(zero_stage=3), HW, params, 2, 2, 0.0, 0.0, 0.0, True)
    gather = _t("all_gather", BIG, _plan())
    assert three.forward == pytest.approx(gather) and three.input == pytest.approx(gather)
    # 3Ψ: two weight all-gathers and one gradient reduce-scatter per micro-batch.
    assert three.weight == pytest.approx(two.weight)


def test_units_pay_their_own_latency_and_blocking_links_hide_nothing():
    """k calls of a unit each pay the rounds' α, the bytes stay the same (so the excess over
    one call is exactly (k − 1) × the zero-byte call); where collectives block the
    computing thread, no window hides any of it."""
    plan, k = _plan(), 7
    one, many = _t("all_gather", BIG, plan), k * _t("all_gather", BIG / k, plan)
    latency = _t("all_gather", 1e-9, plan)  # the rounds' α, no bytes to speak of
    gather = (("all_gather", BIG),)
    assert exposed(gather, plan, HW, 0.0, k) == pytest.approx(many)
    assert many - one == pytest.approx((k - 1) * latency, rel=1e-6)
    assert exposed(gather, plan, HW, 1e9, k) < many  # overlapped: hidden
    blocking = replace(HW, comm_overlap=False)
    assert exposed(gather, plan, blocking, 1e9, k) == pytest.approx(many)
    assert bucketed("all_reduce", BIG, plan, blocking, 1e9) == pytest.approx(
        _t("all_reduce", BIG, plan)
    )
    # end of step and per action pass the unit count through
    z1 = _plan(zero_stage=1)
    assert end_of_step(z1, blocking, BIG / 2, 2, 2, 1.0, 1.0, k) == pytest.approx(
        k * (_t("reduce_scatter", BIG / k, z1) + _t("all_gather", BIG / k, z1))
    )
    z3 = per_action(_plan(zero_stage=3), blocking, BIG / 2, 2, 2, 1.0, 1.0, 1.0, False, k)
    assert z3.forward == pytest.approx(k * _t("all_gather", BIG / k, plan))


def test_simulate_prices_units_and_refuses_a_bad_count():
    from impls.simulator import simulate
    from tests.simulator import TINY

    plan = ParallelPlan(dp=4, tp=1, pp=1, zero_stage=3)
    one = simulate(TINY, plan, HW, dp_collectives=1).exposed_dp_s
    assert simulate(TINY, plan, HW, dp_collectives=3).exposed_dp_s > one
    per_layer = simulate(TINY, plan, HW, dp_collectives=TINY.n_layers + 2)  # embedding, head
    assert simulate(TINY, plan, HW) == per_layer  # default: one unit per layer
    for bad in (0, -1, True, 2.0):
        with pytest.raises(ValueError, match="dp_collectives"):
            simulate(TINY, plan, HW, dp_collectives=bad)


@pytest.mark.parametrize(
    ("stage", "forward", "input_", "weight", "end"),
    [(0, 0, 0, 0, 1), (1, 0, 0, 0, 2), (2, 0, 0, 7, 1), (3, 7, 7, 0, 0)],
)
def test_each_meeting_after_compute_pays_the_meeting_once(stage, forward, input_, weight, end):
    """Where collectives block the computing thread, each meeting of the ranks after compute
    adds `collective_meeting_s` on top of the calls' α–β (counted by hand from the order
    `impls.zero` issues its 7 units' calls in): ZeRO-3 meets at each unit's forward gather
    and at its backward gather (its reduce-scatter follows the backward back to back with
    the next gather); ZeRO-2 at each unit's reduce-scatter; the end of the step once for
    ZeRO-0's all-reduce, once for ZeRO-1's reduce-scatters and once for ZeRO-1/2's gathers
    after the optimizer. Overlapping hardware pays none; one rank meets nobody."""
    k, meet = 7, 3e-3
    plan = _plan(zero_stage=stage)
    plain = replace(HW, comm_overlap=False)
    met = replace(plain, collective_meeting_s=meet)
    args = (BIG / 2, 2, 2, 1.0, 1.0, 1.0, False, k)
    base, paid = per_action(plan, plain, *args), per_action(plan, met, *args)
    assert paid.forward - base.forward == pytest.approx(forward * meet)
    assert paid.input - base.input == pytest.approx(input_ * meet)
    assert paid.weight - base.weight == pytest.approx(weight * meet)
    tail = (BIG / 2, 2, 2, 1.0, 1.0, k)
    assert end_of_step(plan, met, *tail) - end_of_step(plan, plain, *tail) == pytest.approx(
        end * meet
    )
    overlapping = replace(HW, collective_meeting_s=meet)
    assert per_action(plan, overlapping, *args) == per_action(plan, HW, *args)
    assert end_of_step(plan, overlapping, *tail) == end_of_step(plan, HW, *tail)
    assert end_of_step(_plan(zero_stage=stage, dp=1), met, *tail) == 0
